//! The device API (DPS-1 over HTTPS): `PUT /{idScope}/registrations/{id}/register`,
//! `GET /{idScope}/registrations/{id}/operations/{operationId}` and the status lookup
//! `POST /{idScope}/registrations/{id}`, authenticated by a SAS token in `Authorization` or
//! the TLS client certificate.

use std::net::IpAddr;

use serde_json::Value;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::{api_version, refusal};
use crate::hub::provisioning::{
    parse_register_body, status_json, Credential, OperationState, RegisterRequest,
    MAX_REGISTER_BODY, RETRY_AFTER_SECS,
};
use crate::rest::error::ApiError;
use crate::rest::reply::{json, json_with_status, one_of, Handled, Response};
use crate::rest::PeerAddr;
use crate::rest::{Context, PathId};
use crate::x509::PeerChain;

pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let with_ctx = move || {
        let ctx = ctx.clone();
        warp::any().map(move || ctx.clone())
    };
    one_of([
        warp::path!(String / "registrations" / PathId / "register")
            .and(warp::put())
            .and(api_version())
            .and(with_ctx())
            .and(credential())
            .and(source())
            .and(body())
            .then(register)
            .boxed(),
        warp::path!(String / "registrations" / PathId / "operations" / PathId)
            .and(warp::get())
            .and(api_version())
            .and(with_ctx())
            .and(credential())
            .and(source())
            .then(operation_status)
            .boxed(),
        warp::path!(String / "registrations" / PathId)
            .and(warp::post())
            .and(api_version())
            .and(with_ctx())
            .and(credential())
            .and(source())
            .then(registration_status)
            .boxed(),
    ])
}

/// The SAS token in `Authorization`, else the TLS client certificate chain; `None` when the
/// request has neither.
fn credential() -> impl Filter<Extract = (Option<Credential>,), Error = warp::Rejection> + Clone {
    warp::header::optional::<String>("authorization")
        .and(warp::ext::optional::<PeerChain>())
        .map(
            |token: Option<String>, chain: Option<PeerChain>| match token {
                Some(t) => Some(Credential::Sas(t)),
                None => chain
                    .filter(|c| !c.0.is_empty())
                    .map(|c| Credential::Certificate(c.0.to_vec())),
            },
        )
}

/// The client's address as the listener recorded it (unspecified when there is none).
fn source() -> impl Filter<Extract = (IpAddr,), Error = std::convert::Infallible> + Clone {
    warp::ext::optional::<PeerAddr>()
        .map(|peer: Option<PeerAddr>| peer.map_or(IpAddr::from([0, 0, 0, 0]), |p| p.0.ip()))
}

/// The body's bytes, at most the register body's limit.
fn body() -> impl Filter<Extract = (bytes::Bytes,), Error = warp::Rejection> + Clone {
    warp::body::content_length_limit(MAX_REGISTER_BODY as u64).and(warp::body::bytes())
}

fn request(
    id_scope: String,
    PathId(registration_id): PathId,
    credential: Option<Credential>,
    payload: Option<Value>,
    source: IpAddr,
) -> Result<RegisterRequest, ApiError> {
    let credential = credential.ok_or_else(|| {
        refusal(
            StatusCode::UNAUTHORIZED,
            401002,
            "no SAS token in Authorization and no client certificate",
        )
    })?;
    Ok(RegisterRequest {
        id_scope,
        registration_id,
        credential,
        payload,
        source,
    })
}

fn with_retry_after(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert("retry-after", RETRY_AFTER_SECS.into());
    response
}

async fn register(
    id_scope: String,
    rid: PathId,
    ctx: Context,
    credential: Option<Credential>,
    source: IpAddr,
    body: bytes::Bytes,
) -> Handled {
    let payload = parse_register_body(&body, &rid.0)?;
    let request = request(id_scope, rid, credential, payload, source)?;
    let op = ctx.provisioning.register(&ctx, request).await?;
    Ok(with_retry_after(json_with_status(
        &status_json::operation(&op),
        StatusCode::ACCEPTED,
    )))
}

async fn operation_status(
    id_scope: String,
    rid: PathId,
    PathId(operation_id): PathId,
    ctx: Context,
    credential: Option<Credential>,
    source: IpAddr,
) -> Handled {
    let request = request(id_scope, rid, credential, None, source)?;
    let op = ctx
        .provisioning
        .operation_status(request, &operation_id)
        .await?;
    let body = status_json::operation(&op);
    Ok(match op.state {
        OperationState::Assigning => {
            with_retry_after(json_with_status(&body, StatusCode::ACCEPTED))
        }
        _ => json(&body),
    })
}

async fn registration_status(
    id_scope: String,
    rid: PathId,
    ctx: Context,
    credential: Option<Credential>,
    source: IpAddr,
) -> Handled {
    let request = request(id_scope, rid, credential, None, source)?;
    let record = ctx.provisioning.registration_status(request).await?;
    Ok(json(&status_json::registration_state(&record)))
}
