//! The body of a DPS register request, read the same way whichever protocol carried it (MQTT
//! `$dps/registrations/PUT/iotdps-register/`, HTTPS `PUT .../register`, AMQP
//! `iotdps-register`): `{"registrationId": ..., "payload": ..., "tpm": ...}` as the SDKs send it.
//!
//! # Invariants
//! - An empty (or all-whitespace) body is a register without a payload: the Node SDK's HTTP
//!   transport may send none.
//! - Anything else must be one JSON object; its `registrationId`, when present and not null,
//!   must be the one the request's topic, path or link address names.
//! - A non-null `tpm` is refused: this provisioning service has no TPM attestation, and
//!   ignoring it would attest the device by another credential than it presented.
//! - A refusal is [`DpsFailure::BadRequest`] with the same text on every protocol. A body over
//!   [`MAX_REGISTER_BODY`] is one too, except over HTTPS, whose listener refuses it with 413
//!   before reading it.

use serde_json::Value;

use super::DpsFailure;

/// Bodies larger than this are refused before they are parsed (the HTTPS listener's limit).
pub const MAX_REGISTER_BODY: usize = 64 * 1024;

/// The register body's `payload` (`None` when there is none).
///
/// # Errors
/// [`DpsFailure::BadRequest`] when the body breaks one of the module's rules.
pub fn parse_register_body(
    body: &[u8],
    registration_id: &str,
) -> Result<Option<Value>, DpsFailure> {
    if body.len() > MAX_REGISTER_BODY {
        return Err(DpsFailure::BadRequest(format!(
            "the register body is {} bytes, over the limit of {MAX_REGISTER_BODY}",
            body.len()
        )));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| DpsFailure::BadRequest(format!("the register body is not JSON: {e}")))?;
    let Value::Object(fields) = v else {
        return Err(DpsFailure::BadRequest(
            "the register body must be a JSON object".into(),
        ));
    };
    match fields.get("registrationId") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == registration_id => {}
        Some(other) => {
            return Err(DpsFailure::BadRequest(format!(
                "registrationId {other} in the body is not {registration_id:?}"
            )))
        }
    }
    if fields.get("tpm").is_some_and(|t| !t.is_null()) {
        return Err(DpsFailure::BadRequest(
            "TPM attestation is not supported by this provisioning service".into(),
        ));
    }
    Ok(fields.get("payload").cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(body: &[u8]) -> String {
        match parse_register_body(body, "dev-1") {
            Err(DpsFailure::BadRequest(text)) => text,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_the_sdks_send_is_read() {
        assert_eq!(parse_register_body(b"", "dev-1").unwrap(), None);
        assert_eq!(parse_register_body(b" \n", "dev-1").unwrap(), None);
        assert_eq!(
            parse_register_body(br#"{"registrationId":"dev-1"}"#, "dev-1").unwrap(),
            None
        );
        assert_eq!(
            parse_register_body(
                br#"{"registrationId":"dev-1","payload":{"site":"a"},"tpm":null}"#,
                "dev-1"
            )
            .unwrap(),
            Some(serde_json::json!({"site": "a"}))
        );
        assert_eq!(
            parse_register_body(br#"{"payload":null,"registrationId":"dev-1"}"#, "dev-1").unwrap(),
            Some(Value::Null)
        );
        assert_eq!(
            parse_register_body(br#"{"payload":[1,2]}"#, "dev-1").unwrap(),
            Some(serde_json::json!([1, 2]))
        );
    }

    #[test]
    fn every_malformed_body_is_a_bad_request() {
        assert!(refusal(b"{").contains("not JSON"));
        assert!(refusal(b"[1]").contains("JSON object"));
        assert!(refusal(b"\"dev-1\"").contains("JSON object"));
        assert!(refusal(br#"{"registrationId":"other"}"#).contains("is not \"dev-1\""));
        assert!(refusal(br#"{"registrationId":7}"#).contains("is not \"dev-1\""));
        assert!(refusal(br#"{"tpm":{"endorsementKey":"x"}}"#).contains("TPM"));
        assert!(refusal(&vec![b' '; MAX_REGISTER_BODY + 1]).contains("over the limit"));
    }
}
