"""pyinfra-testing fixtures: tests/facts/<module>.<Fact>/*.yml (command, requires_command, output, fact); a vendor's
module is its pack's facts (``nvidia.NvidiaGpus``: ``k3deploy/vendors/nvidia/facts.py``)."""


from pyinfra_testing.facts import make_fact_tests

from helpers import FACTS
from k3deploy.vendors import PACKS

# one TestCase class per "<module>.<Fact>" folder, one test per fixture file
for _folder in sorted(p for p in FACTS.iterdir() if p.is_dir()):
    _module, _, _fact = _folder.name.rpartition(".")
    _base, _path = (("k3deploy.vendors", f"{_module}.facts.{_fact}") if _module in {p.name for p in PACKS}
                    else ("k3deploy.facts", _folder.name))
    locals()[f"TestFact_{_folder.name.replace('.', '_')}"] = make_fact_tests(_base, _path, _folder)
