"""Reading and comparing results: ``show`` (a study's best and trials), ``compare`` (fa-tune
beside its peers), ``profile`` / ``profile_driver`` (Nsight Compute on a trial's kernel)."""
