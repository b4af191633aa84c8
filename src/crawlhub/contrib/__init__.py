"""Integrations of crawlhub with other tools (``crawlhub.contrib.scrapy``)."""
