from django.db import models


class Note(models.Model):
    """What the ``add_note`` task writes."""

    text = models.CharField(max_length=200)
    created = models.DateTimeField(auto_now_add=True)


class Tick(models.Model):
    """One row per run of the workers' periodic job (``jobs.record_tick``): one per tick."""

    at = models.DateTimeField()
    instance = models.CharField(max_length=100)
