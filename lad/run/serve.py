"""`lad serve`: debiased N-way choices over HTTP on vLLM's async engine (docs/backends.md,
"Serving").

POST /choose with JSON {"query": caption} or {"question": text}, and {"images": [paths inside the
server's image root, relative to it or absolute]} or {"texts": [candidates]}: the answer is `lad
predict --json`'s (lad.run.debiaser.Choice: vanilla and LAD choices, P before and after, the
posterior π, the layers L*). Each HTTP request is its own item, its engine requests carry their own
capture tags, and they go to the engine at once: the engine batches concurrent requests itself
(continuous batching). At most `max_queue` requests are in flight; past that the answer is 503 at
once. Bad input is a 4xx with one line, {"error": ...}, before any model work. GET /health says
whether the engine is up.
Served by uvicorn (an ASGI server) on a starlette app, both vLLM dependencies.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.errors import LadError

HOST = "127.0.0.1"


@dataclass
class Service:
    """The loaded engine, the fitted Debiaser (read only) and the queue's bound."""

    debiaser: Any  # lad.run.debiaser.Debiaser, fitted (its backend: a VllmBackend without LLM)
    engine: Any  # vllm AsyncLLM
    max_queue: int
    image_root: Path = Path(".")  # the only folder request paths may name (lad.io.files.inside)
    in_flight: int = 0
    served: int = 0
    _ids: Any = field(default_factory=itertools.count)

    async def choose(self, body: dict[str, Any]) -> dict[str, Any]:
        """One choice (LadError on bad input, before the engine is asked)."""
        from lad.backends.vllm_engine import assemble
        from lad.core.labels import get_scheme
        from lad.core.records import RecordSet

        item = await asyncio.to_thread(_item, body, next(self._ids), self.image_root)
        deb = self.debiaser
        template = deb._template([item])
        labels = deb.check_calibration_for(item.num_candidates, template)
        backend = deb.backend
        request = (item, 0, list(range(item.num_candidates)))
        planned = await asyncio.to_thread(
            backend.prepare, [request], template, get_scheme(deb.labels), True
        )
        try:
            outputs = await asyncio.gather(
                *(
                    self._generate(prompt, params, f"{tag}-{k}")
                    for k, (prompt, params, tag) in enumerate(
                        zip(planned.prompts, planned.params, _tags(planned), strict=True)
                    )
                )
            )
            taken = await self.engine.collective_rpc("lad_take", args=(planned.tags,))
        except BaseException:
            await self.engine.collective_rpc("lad_drop", args=(planned.tags,))
            raise
        records = RecordSet.from_records(assemble(planned, outputs, taken, backend.num_layers))
        deb.calibration_.check_compatible(records, strict=False)
        return deb._choices([item], records, labels)[0].to_dict()

    async def _generate(self, prompt: dict[str, Any], params: Any, request_id: str) -> Any:
        final = None
        async for out in self.engine.generate(prompt, params, request_id):
            final = out
        return final


def _tags(planned: Any) -> list[str]:
    """Each engine request's id: its record's capture tag (one record per HTTP request here)."""
    return [planned.tags[b] for b, _ in planned.asks]


def _item(body: Any, number: int, image_root: Path) -> Any:
    """The HTTP body as an Item, or a LadError naming what is wrong (lad predict's checks); its
    pictures are paths inside `image_root`, symlinks resolved."""
    from lad.data.items import Item
    from lad.io import limits
    from lad.io.files import inside, outside
    from lad.io.images import check_image

    if not isinstance(body, dict):
        raise LadError("the body must be a JSON object")
    unknown = sorted(set(body) - {"query", "question", "images", "texts"})
    if unknown:
        raise LadError(f"unknown field {unknown[0]!r}; fields: query or question, images or texts")
    asked = [k for k in ("query", "question") if k in body]
    if len(asked) != 1:
        raise LadError("give exactly one of 'query' (a caption) and 'question'")
    text = body[asked[0]]
    if not isinstance(text, str) or not text.strip():
        raise LadError(f"'{asked[0]}' must be a non-empty string")
    limits.QUERY.check(len(text), asked[0])
    kinds = [k for k in ("images", "texts") if k in body]
    if len(kinds) != 1:
        raise LadError("give exactly one of 'images' (paths on the server) and 'texts'")
    given = body[kinds[0]]
    if not isinstance(given, list) or len(given) < 2 or not all(isinstance(g, str) for g in given):
        raise LadError(f"'{kinds[0]}' must be a list of at least 2 strings")
    question = text if asked[0] == "question" else None
    if kinds[0] == "texts":
        if not all(t.strip() for t in given):
            raise LadError("'texts' holds an empty candidate")
        return Item(f"request-{number}", text, [], 0, question=question, candidates=list(given))
    paths = [inside(image_root, p) for p in given]
    for k, (path, named) in enumerate(zip(paths, given, strict=True)):
        if path is None:
            where = "is outside" if outside(image_root, named) else "is no file in"
            raise LadError(f"'images'[{k}]: {named!r} {where} {image_root}, the server's pictures")
        check_image(path)
    return Item(f"request-{number}", text, paths, 0, question=question)


def app(service_factory: Any) -> Any:
    """The starlette app; `service_factory()` (awaited at start-up) makes the Service."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    state: dict[str, Service] = {}

    @asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        state["service"] = await service_factory()
        try:
            yield
        finally:
            state["service"].engine.shutdown()

    async def choose(request: Request) -> JSONResponse:
        service = state["service"]
        if service.in_flight >= service.max_queue:
            return _error(503, f"busy: {service.max_queue} requests are in flight; retry later")
        service.in_flight += 1
        try:
            try:
                body = json.loads(await request.body())
            except (ValueError, UnicodeDecodeError):
                return _error(400, "the body is not JSON")
            try:
                answer = await service.choose(body)
            except LadError as e:
                return _error(422 if "calibration" in type(e).__name__.lower() else 400, str(e))
            service.served += 1
            return JSONResponse(answer)
        finally:
            service.in_flight -= 1

    async def health(_request: Request) -> JSONResponse:
        service = state["service"]
        return JSONResponse(
            {"status": "ok", "in_flight": service.in_flight, "served": service.served}
        )

    return Starlette(
        routes=[Route("/choose", choose, methods=["POST"]), Route("/health", health)],
        lifespan=lifespan,
    )


def _error(status: int, message: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message.splitlines()[0]}, status_code=status)


def serve(
    debiaser: Any,
    *,
    host: str = HOST,
    port: int = 8000,
    max_queue: int = 64,
    image_root: str | Path = ".",
    engine_args: dict[str, Any] | None = None,
) -> None:
    """Run the service until interrupted. `debiaser`: fitted (a loaded calibration), unloaded."""
    from lad.backends.vllm_engine import VllmBackend, engine_setup

    if max_queue < 1:
        raise LadError(f"--max-queue must be >= 1. Got {max_queue}.")
    image_root = Path(image_root).resolve()
    if not image_root.is_dir():
        raise LadError(f"--image-root {image_root}: no such folder")
    spec = debiaser.spec
    ckpt, args = engine_setup(spec.load_settings(dtype=debiaser.dtype), engine_args)

    async def factory() -> Service:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        backend = VllmBackend(ckpt, None)
        backend.check_installed(await engine.collective_rpc("lad_install"))
        debiaser._backend = backend
        print(f"lad serve: listening on http://{host}:{port} (POST /choose)", flush=True)
        return Service(debiaser, engine, max_queue, image_root)

    import uvicorn  # a vLLM dependency: imported once engine_setup found vLLM

    config = uvicorn.Config(app(factory), host=host, port=port, log_level="warning")
    uvicorn.Server(config).run()
