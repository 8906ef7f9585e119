"""The docs' "Writing an app" example, complete: ``python -m worker --app myservice.jobs:app``."""
