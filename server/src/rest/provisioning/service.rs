//! The provisioning service API (DPS-4, api-version 2021-10-01, as the Node
//! `azure-iot-provisioning-service` client calls it): enrollments and enrollment groups
//! (create or replace under `If-Match`, read, delete, query with continuation, bulk), their
//! attestation mechanisms, and registration states (read, delete, query by group).
//!
//! # Invariants
//! - `PUT` without `If-Match` creates (409 when the id exists); with one it replaces (412 on
//!   another etag).
//! - A query answers a JSON array; `x-ms-continuation` is sent only when more remain (an empty
//!   one would make the Node client start over forever).

use ferrohub_engine::model::IfMatch;
use ferrohub_engine::provisioning::{
    BulkMode, Enrollment, EnrollmentKind, EnrollmentWrite, ProvisioningError, ProvisioningRights,
};
use ferrohub_engine::StorageError;
use serde_json::{json, Value};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Rejection};

use super::enrollment_json::{attestation_json, enrollment_json, parse_enrollment};
use super::{api_version, bad_request, engine_error, json_body, refusal};
use crate::auth::provisioning::service_rights;
use crate::auth::sas::SasToken;
use crate::hub::provisioning::status_json;
use crate::rest::error::ApiError;
use crate::rest::reply::{json as json_reply, no_content, one_of, Handled, Response};
use crate::rest::{if_match, Context, PathId};

/// Items in a query page unless `x-ms-max-item-count` says otherwise, and the most.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// What a call needs.
#[derive(Clone, Copy)]
enum Right {
    EnrollmentRead,
    EnrollmentWrite,
    RegistrationRead,
    RegistrationWrite,
}

impl Right {
    fn held_by(self, rights: &ProvisioningRights) -> bool {
        match self {
            Right::EnrollmentRead => rights.enrollment_read,
            Right::EnrollmentWrite => rights.enrollment_write,
            Right::RegistrationRead => rights.registration_status_read,
            Right::RegistrationWrite => rights.registration_status_write,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Right::EnrollmentRead => "EnrollmentRead",
            Right::EnrollmentWrite => "EnrollmentWrite",
            Right::RegistrationRead => "RegistrationStatusRead",
            Right::RegistrationWrite => "RegistrationStatusWrite",
        }
    }
}

/// The context, once the caller's provisioning policy token holds `right`.
fn caller(
    ctx: Context,
    right: Right,
) -> impl Filter<Extract = (Context,), Error = Rejection> + Clone {
    api_version()
        .and(warp::header::optional::<String>("authorization"))
        .and_then(move |token: Option<String>| {
            let ctx = ctx.clone();
            async move {
                let unauthorized =
                    |m: String| warp::reject::custom(refusal(StatusCode::UNAUTHORIZED, 401002, m));
                let token = token
                    .ok_or_else(|| unauthorized("no authorization token was supplied".into()))?;
                let token = SasToken::parse(&token).map_err(|e| unauthorized(e.to_string()))?;
                let rights = service_rights(
                    &token,
                    ctx.provisioning.settings(),
                    &*ctx.settings,
                    ctx.clock.now_secs(),
                )
                .map_err(|e| unauthorized(e.to_string()))?;
                if !right.held_by(&rights) {
                    return Err(unauthorized(format!(
                        "the policy lacks the {} right",
                        right.name()
                    )));
                }
                Ok(ctx)
            }
        })
}

/// `x-ms-max-item-count` and `x-ms-continuation`.
fn paging() -> impl Filter<Extract = ((usize, Option<String>),), Error = Rejection> + Clone {
    warp::header::optional::<String>("x-ms-max-item-count")
        .and(warp::header::optional::<String>("x-ms-continuation"))
        .and_then(
            |count: Option<String>, continuation: Option<String>| async move {
                let size = match count {
                    None => DEFAULT_PAGE,
                    Some(c) => match c.trim().parse::<usize>() {
                        Ok(n) if n > 0 => n.min(MAX_PAGE),
                        _ => {
                            return Err(warp::reject::custom(bad_request(format!(
                                "x-ms-max-item-count {c:?} is not a positive number"
                            ))))
                        }
                    },
                };
                Ok::<_, Rejection>((size, continuation.filter(|c| !c.is_empty())))
            },
        )
}

/// A path segment with no further segments (`/enrollments` and `/enrollments/` alike).
fn exactly(segment: &'static str) -> impl Filter<Extract = (), Error = Rejection> + Clone {
    warp::path(segment)
        .and(warp::path::tail())
        .and_then(|rest: warp::path::Tail| async move {
            if rest.as_str().is_empty() {
                Ok(())
            } else {
                Err(warp::reject::not_found())
            }
        })
        .untuple_one()
}

pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let c = |right| caller(ctx.clone(), right);
    let kind = |k: EnrollmentKind| warp::any().map(move || k);
    let mut table = Vec::new();
    for (segment, k) in [
        ("enrollments", EnrollmentKind::Individual),
        ("enrollmentGroups", EnrollmentKind::Group),
        ("enrollmentgroups", EnrollmentKind::Group),
    ] {
        table.extend([
            warp::path(segment)
                .and(warp::path!("query"))
                .and(warp::post())
                .and(c(Right::EnrollmentRead))
                .and(kind(k))
                .and(paging())
                .then(query_enrollments)
                .boxed(),
            warp::path(segment)
                .and(warp::path!(PathId / "attestationmechanism"))
                .and(warp::post())
                .and(c(Right::EnrollmentRead))
                .and(kind(k))
                .then(attestation_mechanism)
                .boxed(),
            warp::path(segment)
                .and(warp::path!(PathId))
                .and(warp::put())
                .and(c(Right::EnrollmentWrite))
                .and(kind(k))
                .and(if_match())
                .and(json_body())
                .then(put_enrollment)
                .boxed(),
            warp::path(segment)
                .and(warp::path!(PathId))
                .and(warp::get())
                .and(c(Right::EnrollmentRead))
                .and(kind(k))
                .then(get_enrollment)
                .boxed(),
            warp::path(segment)
                .and(warp::path!(PathId))
                .and(warp::delete())
                .and(c(Right::EnrollmentWrite))
                .and(kind(k))
                .and(if_match())
                .then(delete_enrollment)
                .boxed(),
            exactly(segment)
                .and(warp::post())
                .and(c(Right::EnrollmentWrite))
                .and(kind(k))
                .and(json_body())
                .then(bulk)
                .boxed(),
        ]);
    }
    table.extend([
        warp::path!("registrations" / PathId / "query")
            .and(warp::post())
            .and(c(Right::RegistrationRead))
            .and(paging())
            .then(query_registrations)
            .boxed(),
        warp::path!("registrations" / PathId)
            .and(warp::get())
            .and(c(Right::RegistrationRead))
            .then(get_registration)
            .boxed(),
        warp::path!("registrations" / PathId)
            .and(warp::delete())
            .and(c(Right::RegistrationWrite))
            .and(if_match())
            .then(delete_registration)
            .boxed(),
    ]);
    one_of(table)
}

async fn run<T: Send + 'static>(
    ctx: &Context,
    f: impl FnOnce(&ferrohub_engine::Store) -> Result<T, ProvisioningError> + Send + 'static,
) -> Result<T, ApiError> {
    ctx.store
        .run(move |s| Ok::<_, StorageError>(f(s)))
        .await?
        .map_err(engine_error)
}

async fn registration_state_of(ctx: &Context, id: &str) -> Result<Option<Value>, ApiError> {
    let id = id.to_string();
    match run(ctx, move |s| s.get_registration(&id)).await {
        Ok(r) => Ok(Some(status_json::registration_state(&r))),
        Err(ApiError::Provisioning { status, .. }) if status == StatusCode::NOT_FOUND => Ok(None),
        Err(e) => Err(e),
    }
}

async fn put_enrollment(
    PathId(id): PathId,
    ctx: Context,
    kind: EnrollmentKind,
    if_match: Option<IfMatch>,
    body: Value,
) -> Handled {
    let previous = {
        let id = id.clone();
        match run(&ctx, move |s| s.get_enrollment(kind, &id)).await {
            Ok(e) => Some(e),
            Err(ApiError::Provisioning { status, .. }) if status == StatusCode::NOT_FOUND => None,
            Err(e) => return Err(e),
        }
    };
    let write = parse_enrollment(&body, kind, &id, previous.as_ref())
        .map_err(|e| bad_request(e.to_string()))?;
    let call = crate::hub::calls::PutEnrollment {
        write,
        if_match,
        now: ctx.clock.now(),
    };
    let stored = ctx.write(call).await.map_err(engine_error)?;
    let state = match kind {
        EnrollmentKind::Individual => registration_state_of(&ctx, &id).await?,
        EnrollmentKind::Group => None,
    };
    Ok(json_reply(&enrollment_json(
        &stored,
        true,
        ctx.provisioning.host_name(),
        state,
    )))
}

async fn get_enrollment(PathId(id): PathId, ctx: Context, kind: EnrollmentKind) -> Handled {
    let found = {
        let id = id.clone();
        run(&ctx, move |s| s.get_enrollment(kind, &id)).await?
    };
    let state = match kind {
        EnrollmentKind::Individual => registration_state_of(&ctx, &id).await?,
        EnrollmentKind::Group => None,
    };
    Ok(json_reply(&enrollment_json(
        &found,
        false,
        ctx.provisioning.host_name(),
        state,
    )))
}

async fn delete_enrollment(
    PathId(id): PathId,
    ctx: Context,
    kind: EnrollmentKind,
    if_match: Option<IfMatch>,
) -> Handled {
    let call = crate::hub::calls::DeleteEnrollment {
        kind,
        id,
        if_match: if_match.unwrap_or(IfMatch::Any),
    };
    ctx.write(call).await.map_err(engine_error)?;
    Ok(no_content())
}

async fn attestation_mechanism(PathId(id): PathId, ctx: Context, kind: EnrollmentKind) -> Handled {
    let found = run(&ctx, move |s| s.get_enrollment(kind, &id)).await?;
    Ok(json_reply(&attestation_json(&found, true)))
}

fn page_response(items: Vec<Value>, continuation: Option<String>, item_type: &str) -> Response {
    let mut response = json_reply(&items);
    let headers = response.headers_mut();
    if let Ok(v) = item_type.parse() {
        headers.insert("x-ms-item-type", v);
    }
    if let Some(c) = continuation.and_then(|c| c.parse().ok()) {
        headers.insert("x-ms-continuation", c);
    }
    response
}

async fn query_enrollments(
    ctx: Context,
    kind: EnrollmentKind,
    (size, after): (usize, Option<String>),
) -> Handled {
    let page = run(&ctx, move |s| {
        s.list_enrollments(kind, after.as_deref(), size)
            .map_err(ProvisioningError::from)
    })
    .await?;
    let host = ctx.provisioning.host_name();
    let items = page
        .items
        .iter()
        .map(|e| enrollment_json(e, false, host, None))
        .collect();
    let item_type = match kind {
        EnrollmentKind::Individual => "Enrollment",
        EnrollmentKind::Group => "EnrollmentGroup",
    };
    Ok(page_response(items, page.continuation, item_type))
}

/// A bulk body's list field and its items' id field, for `kind`.
fn bulk_fields(kind: EnrollmentKind) -> (&'static str, &'static str) {
    match kind {
        EnrollmentKind::Individual => ("enrollments", "registrationId"),
        EnrollmentKind::Group => ("enrollmentGroups", "enrollmentGroupId"),
    }
}

/// What a bulk body asks before anything is read from the store: its mode and its items.
///
/// # Errors
/// A 400 for a mode that is not one of DPS's, or a body without the list of its kind.
pub(crate) fn bulk_request(
    body: &Value,
    kind: EnrollmentKind,
) -> Result<(BulkMode, &[Value]), ApiError> {
    let mode = match body
        .get("mode")
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
    {
        Some(m) if m == "create" => BulkMode::Create,
        Some(m) if m == "update" => BulkMode::Update,
        Some(m) if m == "updateifmatchetag" => BulkMode::UpdateIfMatchEtag,
        Some(m) if m == "delete" => BulkMode::Delete,
        other => {
            return Err(bad_request(format!(
                "mode {other:?} is not create, update, updateIfMatchETag or delete"
            )))
        }
    };
    let (list_field, _) = bulk_fields(kind);
    let items = body
        .get(list_field)
        .and_then(Value::as_array)
        .ok_or_else(|| bad_request(format!("{list_field} must be an array")))?;
    Ok((mode, items.as_slice()))
}

/// The id a bulk item names.
///
/// # Errors
/// A 400 for an item without a string id.
pub(crate) fn bulk_item_id(item: &Value, kind: EnrollmentKind) -> Result<&str, ApiError> {
    let (_, id_field) = bulk_fields(kind);
    item.get(id_field)
        .and_then(Value::as_str)
        .ok_or_else(|| bad_request(format!("every item needs {id_field}")))
}

/// One item of a bulk body, given the stored enrollment of its id (`previous`): the write it
/// asks for and the etag it names.
///
/// # Errors
/// A 400 naming the item for a body [`parse_enrollment`] refuses, unless the mode is delete:
/// a delete needs only the id.
pub(crate) fn bulk_item(
    mode: BulkMode,
    kind: EnrollmentKind,
    item: &Value,
    id: &str,
    previous: Option<&Enrollment>,
) -> Result<(EnrollmentWrite, Option<String>), ApiError> {
    let write = if mode == BulkMode::Delete {
        // A delete needs only the id; the rest of the item may be anything.
        parse_enrollment(item, kind, id, previous).unwrap_or_else(|_| EnrollmentWrite {
            kind,
            id: id.to_string(),
            attestation: ferrohub_engine::provisioning::AttestationSpec::SymmetricKey(
                Default::default(),
            ),
            device_id: None,
            enabled: true,
            initial_tags: None,
            initial_desired: None,
            iot_edge: false,
            reprovision: Default::default(),
            passthrough: "{}".into(),
        })
    } else {
        parse_enrollment(item, kind, id, previous).map_err(|e| bad_request(format!("{id}: {e}")))?
    };
    let etag = item.get("etag").and_then(Value::as_str).map(|e| {
        e.trim()
            .trim_start_matches("W/")
            .trim_matches('"')
            .to_string()
    });
    Ok((write, etag))
}

async fn bulk(ctx: Context, kind: EnrollmentKind, body: Value) -> Handled {
    let (mode, items) = bulk_request(&body, kind)?;
    let (_, id_field) = bulk_fields(kind);
    let mut writes = Vec::with_capacity(items.len());
    for item in items {
        let id = bulk_item_id(item, kind)?;
        let previous = {
            let id = id.to_string();
            run(&ctx, move |s| Ok(s.get_enrollment(kind, &id).ok())).await?
        };
        let (write, etag) = bulk_item(mode, kind, item, id, previous.as_ref())?;
        writes.push((mode, write, etag));
    }
    let call = crate::hub::calls::BulkEnrollments {
        items: writes,
        now: ctx.clock.now(),
    };
    let errors = ctx.write(call).await.map_err(engine_error)?;
    let errors: Vec<Value> = errors
        .into_iter()
        .map(|e| {
            let status = match engine_error(e.error) {
                ApiError::Provisioning { code, message, .. } => (code, message),
                other => (503000, other.to_string()),
            };
            json!({id_field: e.id, "errorCode": status.0, "errorStatus": status.1})
        })
        .collect();
    Ok(json_reply(&json!({
        "isSuccessful": errors.is_empty(),
        "errors": errors,
    })))
}

async fn get_registration(PathId(id): PathId, ctx: Context) -> Handled {
    let record = run(&ctx, move |s| s.get_registration(&id)).await?;
    Ok(json_reply(&status_json::registration_state(&record)))
}

async fn delete_registration(
    PathId(id): PathId,
    ctx: Context,
    if_match: Option<IfMatch>,
) -> Handled {
    let call = crate::hub::calls::DeleteRegistration {
        id,
        if_match: if_match.unwrap_or(IfMatch::Any),
    };
    ctx.write(call).await.map_err(engine_error)?;
    Ok(no_content())
}

async fn query_registrations(
    PathId(group): PathId,
    ctx: Context,
    (size, after): (usize, Option<String>),
) -> Handled {
    {
        let group = group.clone();
        run(&ctx, move |s| {
            s.get_enrollment(EnrollmentKind::Group, &group)
        })
        .await?;
    }
    let page = run(&ctx, move |s| {
        s.list_group_registrations(&group, after.as_deref(), size)
            .map_err(ProvisioningError::from)
    })
    .await?;
    let items = page
        .items
        .iter()
        .map(status_json::registration_state)
        .collect();
    Ok(page_response(
        items,
        page.continuation,
        "DeviceRegistration",
    ))
}
