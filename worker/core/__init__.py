"""The core: what every wing shares and that does no Redis I/O and reads no settings — time,
identifiers, arq's job wire format (:mod:`worker.core.codec`), payload serializers, schedules,
retry policies and requests, the component lifecycle, metrics, logs, job definitions and hooks,
and the narrow views components get of the runtime."""
