"""rotvid's benchmarks and studies (not part of the installed package): each script runs from the repository root as
a module, ``python -m benchmarks.<name>`` (a script that starts itself again -- ``parallel_bench`` under torchrun,
``kernel_variants`` per setting, ``sanitize_calls`` under compute-sanitizer -- does so the same way, from the same
folder). What the scripts share: ``provenance``, ``results_log``, ``timing``, ``random_wan``, ``study_io``,
``kernel_listing``; how to run each: ``benchmarks/README.md``."""
