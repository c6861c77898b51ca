//! Certificate authorities for X.509 CA-signed devices (SEC-3), RegistryWrite to change,
//! RegistryRead to list: `PUT /certificates/{name}` with `{"certificate": "<PEM>"}`,
//! `GET /certificates`, `DELETE /certificates/{name}`. The CLI has the same
//! (`ferrohub ca add|list|remove`) for a stopped hub.

use ferrohub_engine::hub::CertificateAuthority;
use warp::filters::BoxedFilter;
use warp::Filter;

use super::error::ApiError;
use super::reply::{json, no_content, one_of, Handled, Response};
use super::{caller, json_body, Context, PathId};
use crate::auth::{Permission, Principal};
use crate::x509;

#[derive(serde::Deserialize)]
struct CaBody {
    certificate: String,
}

fn ca_json(ca: &CertificateAuthority) -> serde_json::Value {
    let (sha1, sha256) =
        x509::thumbprints(&rustls::pki_types::CertificateDer::from(ca.der.clone()));
    serde_json::json!({
        "name": ca.name,
        "subject": x509::common_name(&rustls::pki_types::CertificateDer::from(ca.der.clone())).unwrap_or_default(),
        "thumbprint": sha1,
        "thumbprintSha256": sha256,
        "created": super::identity_json::format_time(Some(ca.created)),
    })
}

/// The certificate route table: path, method, inputs, handler.
#[rustfmt::skip]
pub fn routes(ctx: Context) -> BoxedFilter<(Response,)> {
    let caller = || caller(ctx.clone());
    let certificate = || warp::path!("certificates" / PathId);
    one_of([
        certificate().and(warp::put()).and(caller()).and(json_body()).then(put_handler).boxed(),
        warp::path!("certificates").and(warp::get()).and(caller()).then(list_handler).boxed(),
        certificate().and(warp::delete()).and(caller()).then(delete_handler).boxed(),
    ])
}

async fn put_handler(name: PathId, ctx: Context, p: Principal, body: CaBody) -> Handled {
    p.require_hub(Permission::RegistryWrite)?;
    let der = x509::parse_ca(body.certificate.as_bytes())
        .map_err(|e| ApiError::argument(e.to_string()))?;
    let ca = CertificateAuthority {
        name: name.0,
        der,
        created: ctx.clock.now(),
    };
    ctx.write(crate::hub::calls::PutCertificate { ca: ca.clone() })
        .await?;
    Ok(json(&ca_json(&ca)))
}

async fn list_handler(ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryRead)?;
    let cas = ctx.store.run(|s| s.list_certificate_authorities()).await?;
    Ok(json(&cas.iter().map(ca_json).collect::<Vec<_>>()))
}

async fn delete_handler(name: PathId, ctx: Context, p: Principal) -> Handled {
    p.require_hub(Permission::RegistryWrite)?;
    let call = crate::hub::calls::DeleteCertificate {
        name: name.0.clone(),
    };
    if ctx.write(call).await? {
        Ok(no_content())
    } else {
        Err(ApiError::NotFound(format!("certificate {}", name.0)))
    }
}
