"""The consumer, in parts: fetch loop, one-job executor, batched completer, claims and guard.

:class:`~worker.consumer.consumer.Consumer` assembles them; features attach through
:class:`worker.core.jobdefs.JobHook`. Import each name from the module that defines it: the
package re-exports nothing, so the app's use of one part (rates) does not load the consumer.
"""
