# This folder is on sys.path for the tests below it (pytest's rootdir-relative conftest import),
# so they share the Ray-free sweep folder builder: `from fake_sweep import make_sweep`.
