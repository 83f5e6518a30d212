# This folder is on sys.path for every test below it (pytest imports this conftest from its
# folder), so tests share tests/ray_services.py: `from ray_services import ray_head`.

import os
import tempfile

# A warm Ray a user started (`geosweep ray start`) is recorded in ~/.geosweep/ray.json and every
# sweep joins it when given no address (cluster/warm.py). The tests start and stop Rays of their
# own and count on them: a warm Ray left running on the machine, or a sweep of the user's on it,
# must not change what they see. Tests that want a warm Ray point this at their own file.
os.environ["GEOSWEEP_RAY_STATE"] = os.path.join(
    tempfile.mkdtemp(prefix="geosweep-tests-"), "no-warm-ray.json")
