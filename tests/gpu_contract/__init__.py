"""GPU contract tests: what a GPU run needs, checked on a machine without a GPU."""
