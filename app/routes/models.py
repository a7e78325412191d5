"""Model management: upload (and build), describe, list, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Path, Query, Request, UploadFile
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.datastructures import UploadFile as StarletteUploadFile

from ..errors import InvalidInputError, PayloadTooLargeError, check_multipart_whole
from ..responses import SafeJSONResponse as JSONResponse
from ..schemas import ErrorResponse, ModelInfo, ModelList, ModelStatus, parse_spec
from ..security import require_admin, require_query
from .deps import MODEL_ID_DOC, BuildsDep, RegistryDep, known_query, model_entry

router = APIRouter(prefix="/v1/models", tags=["models"])

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorResponse, "description": "Missing bearer token"},
    403: {"model": ErrorResponse, "description": "Wrong token or non-loopback client"},
}
#: The data dir refused a write (uploads and deletes change it): a 503 that waiting does
#: not mend, so documented without ``Retry-After`` (see app.main._document_conventions).
STORAGE_REFUSED = ("The data dir refuses writes (read-only, no permission, I/O error); "
                   "nothing was changed")
_STORAGE: dict[int | str, dict[str, object]] = {
    503: {"model": ErrorResponse, "description": STORAGE_REFUSED},
    507: {"model": ErrorResponse, "description": "The data dir is full; nothing was stored"},
}
ModelId = Annotated[str, Path(description=MODEL_ID_DOC)]
# OpenAPI links: the id an upload returns is what the model's other routes take, so
# clients and stateful testers (schemathesis) can chain an upload to its queries.
_ID = {"model_id": "$response.body#/id"}
_LINKS = {
    "GetModel": {"operationId": "get_model", "parameters": _ID},
    "DeleteModel": {"operationId": "delete_model", "parameters": _ID},
    "Counterfactuals": {"operationId": "counterfactuals", "parameters": _ID},
    "Predict": {"operationId": "predict", "parameters": _ID},
    "MapPicture": {"operationId": "map_png_post", "parameters": _ID},
    "MapPictureGet": {"operationId": "map_png", "parameters": _ID},
    "ModelReady": {"operationId": "v2_model_ready", "parameters": _ID},
}

#: Largest ``spec`` part, as a text field or a file (a spec of 100,000 features with long
#: names and groups is a few MB). Starlette's own cap on a text field (1 MiB) made a big
#: spec a 400 as text and fine as a file; the whole upload stays under
#: ``CFMAPS_MAX_UPLOAD_BYTES`` either way.
SPEC_MAX_BYTES = 64 << 20
#: The parts an upload takes.
_PARTS = ("model", "spec")
#: ``GET /v1/models``: models per page by default and at most. Each carries its schema,
#: so a page of 1,000 models of 100 features is a few MB.
LIST_DEFAULT = 100
LIST_MAX = 1000

_SPEC_DOC = (
    'JSON: {"name": str, "features": [{name, type: continuous|integer|binary|categorical|'
    "nominal, lower, upper, group (categorical: its one-hot group), mutable, "
    "direction: any|increase|decrease, weight}], "
    '"classes": [display names]}. Sent as a text field or as a file.'
)


@router.post(
    "",
    status_code=202,
    response_model=ModelInfo,
    dependencies=[Depends(require_admin), Depends(known_query)],
    responses={
        **_ERRORS,
        **_STORAGE,
        202: {"links": _LINKS},
        400: {"model": ErrorResponse,
              "description": "Malformed multipart body (one cut short included)"},
        413: {"model": ErrorResponse,
              "description": "Upload too large, or its spec over 64 MiB"},
        422: {"model": ErrorResponse,
              "description": "The model file is no model the service reads (any non-empty "
                             "bytes are a valid `model` part, few are a skops, XGBoost or "
                             "LightGBM model file), an unsupported model, a bad spec, "
                             "or a part other than `model` and `spec` or sent twice"},
    },
    summary="Upload a model and build its counterfactual maps",
    # One past the spec's own cap, so that a larger text field reaches the check below
    # (413 on ``spec``) rather than Starlette's 400. (Extra parts, up to Starlette's 1,000,
    # are named by _check_parts.)
    form_limits={"max_part_size": SPEC_MAX_BYTES + 1},
)
async def create_model(
    request: Request,
    registry: RegistryDep,
    builds: BuildsDep,
    model: Annotated[
        UploadFile,
        File(description=("the model file, not empty: skops (scikit-learn), XGBoost JSON or UBJSON, "
                          "LightGBM text; pickle/joblib only if the service trusts them"),
             # format binary: how OpenAPI 3.0 tools (client generators) know a file part;
             # FastAPI states only 3.1's contentMediaType
             json_schema_extra={"minLength": 1, "format": "binary"}),
    ],
    spec: Annotated[str | UploadFile | None, Form(description=_SPEC_DOC)] = None,
) -> JSONResponse:
    """Store the model, check that it is a supported classifier, queue the build (202).

    Poll ``GET /v1/models/{id}`` until ``status`` is ``ready`` (or ``failed``).
    """
    check_multipart_whole(request.scope)  # cut after the model: the spec would be lost
    if not isinstance(model, StarletteUploadFile):  # a text field named "model"
        raise InvalidInputError("'model' must be a file part", "model")
    _check_parts(await request.form())  # parsed once: FastAPI's parse is cached
    if isinstance(spec, StarletteUploadFile):
        spec_text: str | bytes | None = await spec.read(SPEC_MAX_BYTES + 1)
    else:
        spec_text = spec
    if spec_text is not None and len(spec_text) > SPEC_MAX_BYTES:
        raise PayloadTooLargeError(f"spec is over {SPEC_MAX_BYTES >> 20} MiB", "spec")
    parsed = parse_spec(spec_text)
    # Reading and loading the file is blocking, CPU-bound work: keep it off the event loop.
    entry = await run_in_threadpool(registry.register, model.file, parsed, model.filename)
    builds.submit(entry)
    return JSONResponse(
        entry.info(), status_code=202, headers={"Location": f"/v1/models/{entry.id}"}
    )


def _check_parts(form: FormData) -> None:
    """Refuse a part the upload does not take, or a part sent twice, naming it: either
    would otherwise be dropped without a word (FastAPI keeps the last of two)."""
    names = [name for name, _ in form.multi_items()]
    for name in names:
        if name not in _PARTS:
            raise InvalidInputError(
                f"unknown part {name!r}; an upload takes 'model' (the file) and 'spec'", name)
    for name in _PARTS:
        if names.count(name) > 1:
            raise InvalidInputError(f"{names.count(name)} {name!r} parts; send one", name)


@router.get(
    "",
    response_model=ModelList,
    dependencies=[Depends(require_query), Depends(known_query)],
    responses=_ERRORS,
    summary="List models",
)
async def list_models(
    registry: RegistryDep,
    limit: Annotated[int, Query(ge=1, le=LIST_MAX, description=(
        f"Models per page, at most {LIST_MAX}."))] = LIST_DEFAULT,
    cursor: Annotated[str | None, Query(max_length=4096, pattern="^[A-Za-z0-9_-]+$",
                                        description=(
        "The `next_cursor` of the previous page, as it came; none for the first page."))] = None,
    status: Annotated[ModelStatus | None, Query(description=(
        "Only the models of this status."))] = None,
) -> JSONResponse:
    entries, next_cursor = registry.page(limit, cursor, status)
    return JSONResponse({"models": [e.info() for e in entries], "next_cursor": next_cursor})


@router.get(
    "/{model_id}",
    response_model=ModelInfo,
    dependencies=[Depends(require_query), Depends(known_query)],
    responses={**_ERRORS, 404: {"model": ErrorResponse}},
    summary="Status, progress, schema, classes and build statistics of a model",
)
async def get_model(model_id: ModelId, registry: RegistryDep) -> JSONResponse:
    return JSONResponse((await model_entry(registry, model_id)).info())


@router.delete(
    "/{model_id}",
    status_code=204,
    dependencies=[Depends(require_admin), Depends(known_query)],
    responses={**_ERRORS, **_STORAGE, 404: {"model": ErrorResponse}},
    summary="Delete a model (a running build is cancelled)",
)
def delete_model(model_id: ModelId, registry: RegistryDep) -> Response:
    # A plain ``def``: FastAPI runs it in the threadpool, since it may wait for a build to
    # finish writing its files (and catch up on a model another process uploaded).
    registry.delete(model_id)
    return Response(status_code=204)
