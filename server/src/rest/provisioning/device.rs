//! The device API (DPS-1 over HTTPS): `PUT /{idScope}/registrations/{id}/register`,
//! `GET /{idScope}/registrations/{id}/operations/{operationId}` and the status lookup
//! `POST /{idScope}/registrations/{id}`, authenticated by a SAS token in `Authorization` or
//! the TLS client certificate.

use serde_json::Value;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::{api_version, bad_request, refusal};
use crate::hub::provisioning::{
    status_json, Credential, OperationState, RegisterRequest, RETRY_AFTER_SECS,
};
use crate::rest::error::ApiError;
use crate::rest::reply::{json, json_with_status, one_of, Handled, Response};
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
            .and(body())
            .then(register)
            .boxed(),
        warp::path!(String / "registrations" / PathId / "operations" / PathId)
            .and(warp::get())
            .and(api_version())
            .and(with_ctx())
            .and(credential())
            .then(operation_status)
            .boxed(),
        warp::path!(String / "registrations" / PathId)
            .and(warp::post())
            .and(api_version())
            .and(with_ctx())
            .and(credential())
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

/// The body as JSON; empty is `{}`.
fn body() -> impl Filter<Extract = (Result<Value, String>,), Error = warp::Rejection> + Clone {
    warp::body::content_length_limit(64 * 1024)
        .and(warp::body::bytes())
        .map(|bytes: bytes::Bytes| {
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Ok(Value::Object(Default::default()));
            }
            serde_json::from_slice::<Value>(&bytes).map_err(|e| e.to_string())
        })
}

fn request(
    id_scope: String,
    PathId(registration_id): PathId,
    credential: Option<Credential>,
    payload: Option<Value>,
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
    body: Result<Value, String>,
) -> Handled {
    let body = body.map_err(|e| bad_request(format!("the body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(bad_request("the body must be a JSON object"));
    }
    match body.get("registrationId") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if *s == rid.0 => {}
        Some(other) => {
            return Err(bad_request(format!(
                "registrationId {other} in the body is not {:?} of the path",
                rid.0
            )))
        }
    }
    if body.get("tpm").is_some_and(|t| !t.is_null()) {
        return Err(bad_request(
            "TPM attestation is not supported by this provisioning service",
        ));
    }
    let payload = body.get("payload").cloned();
    let request = request(id_scope, rid, credential, payload)?;
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
) -> Handled {
    let request = request(id_scope, rid, credential, None)?;
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
) -> Handled {
    let request = request(id_scope, rid, credential, None)?;
    let record = ctx.provisioning.registration_status(request).await?;
    Ok(json(&status_json::registration_state(&record)))
}
