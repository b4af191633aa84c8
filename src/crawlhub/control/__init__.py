"""The control plane (issue 10): projects, forge webhooks, builds, jobs and their runs.

``secrets``: secrets at rest (Fernet); ``hooks``: webhook verification, push events and
release tag patterns.
"""
