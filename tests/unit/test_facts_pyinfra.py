"""pyinfra-testing fixtures: tests/facts/<module>.<Fact>/*.yml (command, requires_command, output, fact)."""


from pyinfra_testing.facts import make_fact_tests

from helpers import FACTS

# one TestCase class per "<module>.<Fact>" folder, one test per fixture file
for _folder in sorted(p for p in FACTS.iterdir() if p.is_dir()):
    locals()[f"TestFact_{_folder.name.replace('.', '_')}"] = make_fact_tests("k3deploy.facts", _folder.name, _folder)
