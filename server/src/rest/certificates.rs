//! Certificate authorities for X.509 CA-signed devices (SEC-3), RegistryWrite to change,
//! RegistryRead to list: `PUT /certificates/{name}` with `{"certificate": "<PEM>"}`,
//! `GET /certificates`, `DELETE /certificates/{name}`. The CLI has the same
//! (`ferrohub ca add|list|remove`) for a stopped hub.

use ferrohub_engine::hub::CertificateAuthority;
use warp::http::StatusCode;
use warp::{Filter, Rejection, Reply};

use super::error::ApiError;
use super::{authenticated, json_body, json_reply, Context, PathId};
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

pub fn routes(
    ctx: Context,
) -> impl Filter<Extract = (warp::reply::Response,), Error = Rejection> + Clone {
    let auth = authenticated(ctx.clone());
    let with_ctx = warp::any().map(move || ctx.clone());
    let put = warp::path!("certificates" / PathId)
        .and(warp::put())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and(json_body::<CaBody>())
        .and_then(
            |name: PathId, ctx: Context, p: Principal, body: CaBody| async move {
                let r = async {
                    p.require_hub(Permission::RegistryWrite)?;
                    let der = x509::parse_ca(body.certificate.as_bytes())
                        .map_err(|e| ApiError::argument(e.to_string()))?;
                    let ca = CertificateAuthority {
                        name: name.0,
                        der,
                        created: ctx.clock.now(),
                    };
                    let stored = ca.clone();
                    ctx.store
                        .run(move |s| s.put_certificate_authority(&stored))
                        .await?;
                    Ok::<_, ApiError>(json_reply(&ca_json(&ca)))
                }
                .await;
                r.map_err(warp::reject::custom)
            },
        );
    let list = warp::path!("certificates")
        .and(warp::get())
        .and(with_ctx.clone())
        .and(auth.clone())
        .and_then(|ctx: Context, p: Principal| async move {
            let r = async {
                p.require_hub(Permission::RegistryRead)?;
                let cas = ctx.store.run(|s| s.list_certificate_authorities()).await?;
                Ok::<_, ApiError>(json_reply(&cas.iter().map(ca_json).collect::<Vec<_>>()))
            }
            .await;
            r.map_err(warp::reject::custom)
        });
    let delete = warp::path!("certificates" / PathId)
        .and(warp::delete())
        .and(with_ctx)
        .and(auth)
        .and_then(|name: PathId, ctx: Context, p: Principal| async move {
            let r = async {
                p.require_hub(Permission::RegistryWrite)?;
                let n = name.0.clone();
                if ctx
                    .store
                    .run(move |s| s.delete_certificate_authority(&n))
                    .await?
                {
                    Ok(
                        warp::reply::with_status(warp::reply(), StatusCode::NO_CONTENT)
                            .into_response(),
                    )
                } else {
                    Err(ApiError::NotFound(format!("certificate {}", name.0)))
                }
            }
            .await;
            r.map_err(warp::reject::custom)
        });
    put.or(list).unify().or(delete).unify()
}
