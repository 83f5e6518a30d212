# This folder is on sys.path for every test below it (pytest imports this conftest from its
# folder), so tests share tests/ray_services.py: `from ray_services import ray_head`.
