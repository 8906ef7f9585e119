"""The storage package: the only code that sends Redis commands, one module per concern.

``keys`` names every key; ``base`` holds the client, the WAIT policy and script calls;
``fenced`` the leader's fenced writes; the other modules each own one concern's scripts
(each beside its one caller), their calls and their typed results; ``store`` composes them.
Import each name from the module that defines it: this package re-exports nothing, so
importing one part does not load every other.
"""
