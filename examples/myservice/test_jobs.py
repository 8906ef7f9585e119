"""The docs' "Testing your app" example: ``python -m pytest examples/myservice`` (pytest.ini
beside it sets ``asyncio_mode = auto``)."""

from myservice.jobs import app
from worker.testing import Harness


async def test_the_receipt_is_sent_once() -> None:
    async with Harness(app) as h:  # startup hooks run; shutdown hooks on exit
        await h.run("send_receipt", 42)
        await h.run("send_receipt", 42)  # the task's ctx.once(...) dedups this one
        assert h.state["mailer"].sent == [42]  # ctx.state, as your startup hook filled it


async def test_the_activation_check_enqueues_one_job_per_package() -> None:
    async with Harness(app) as h:
        await h.tick("package_activation_check")  # ctx.tick = the schedule's latest instant
        assert await h.run_enqueued() == 3  # the jobs the tick enqueued, run inline
        assert h.state["db"].activated == [101, 102, 103]
