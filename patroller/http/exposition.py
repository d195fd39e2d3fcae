"""What machines read of the daemon: its counters (/metrics for Prometheus, /metrics.json)
and the API described (/openapi.json). Each built from the services and the Api, as the other
views are."""

from __future__ import annotations

from patroller.http.handlers import View
from patroller.http.views import counters


class MetricsJsonHandler(View):
    def get(self) -> None:
        self.send(counters(self.services, self.api.status))


class MetricsHandler(View):
    """The Prometheus exposition (OpenMetrics when the scraper asks for it), built at scrape
    time from the daemon's state."""

    async def get(self) -> None:
        accept = self.request.headers.get("Accept")
        body, content_type = await self.api.registries.exposition(accept)
        self.set_header("Content-Type", content_type)
        self.finish(body)

    async def head(self) -> None:
        await self.get()


class OpenApiHandler(View):
    """The API described for machines (OpenAPI 3.1)."""

    def get(self) -> None:
        self.send(self.api.document)
