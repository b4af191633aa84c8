"""``python -m crawlhub ...`` is the ``crawlhub`` command (the job runner starts
``crawlhub crawl`` runs this way, with the server's own interpreter)."""

from crawlhub.cli import main

main()
