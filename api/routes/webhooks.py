"""/v1/webhooks: an owner's subscriptions to job and sweep events, and what became of their deliveries."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from api.auth import PrincipalDep
from api.deps import SessionDep, SettingsDep
from api.errors import responses
from api.webhook_schemas import DeliveryList, DeliveryOut, WebhookCreate, WebhookCreated, WebhookList, WebhookOut
from jobs.infra.secrets import SecretsUnavailable
from jobs.webhooks import ssrf, store
from jobspec.spec import SpecError, SpecProblem

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
WebhookId = Annotated[str, Path(min_length=1, max_length=32)]


@router.post("", status_code=201, response_model=WebhookCreated, summary="Subscribe a URL to job and sweep events")
def create_webhook(body: WebhookCreate, principal: PrincipalDep, session: SessionDep, settings: SettingsDep) -> WebhookCreated:
    try:
        ssrf.check_url(body.url, ssrf.AllowList.parse(settings.webhook_allow_hosts))
    except ssrf.Refused as exc:
        raise SpecError([SpecProblem(("url",), str(exc))]) from None
    try:
        row, secret = store.create(session, settings, principal.owner, body.url, list(body.events), body.format, body.secret)
    except SecretsUnavailable:
        raise SpecError([SpecProblem(("secret",), "webhooks need TORCHYARD_SECRETS_KEY on the API to keep their signing "
                                                  "secrets; ask the operator to set it")]) from None
    return WebhookCreated(**WebhookOut.of(row).model_dump(), secret=secret)


@router.get("", response_model=WebhookList, summary="List webhooks (the admin: every owner's), without secrets")
def list_webhooks(principal: PrincipalDep, session: SessionDep) -> WebhookList:
    return WebhookList(items=[WebhookOut.of(w) for w in store.list_for(session, principal.owner)])


@router.delete("/{webhook_id}", status_code=204, response_class=Response, responses=responses(404),
               summary="Remove a webhook; its pending deliveries are dropped")
def delete_webhook(webhook_id: WebhookId, principal: PrincipalDep, session: SessionDep) -> Response:
    store.remove(session, principal.owner, webhook_id)
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", response_model=DeliveryList, responses=responses(404),
            summary="The webhook's latest deliveries, newest first: event, status, tries, last HTTP status and error")
def list_deliveries(webhook_id: WebhookId, principal: PrincipalDep, session: SessionDep) -> DeliveryList:
    return DeliveryList(items=[DeliveryOut.of(d) for d in store.deliveries(session, principal.owner, webhook_id)])
