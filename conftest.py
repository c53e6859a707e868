"""Root conftest: the plugin that records each pytest run's counts for ``make test``'s summary."""

pytest_plugins = ["tests.support.summary"]
