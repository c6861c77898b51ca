//! Text a device puts in MQTT fields: the property bag, topic names and filters, client ids,
//! user names and SAS tokens.

use super::HOST;
use crate::auth::parse_scope;
use crate::auth::sas::{sign, SasToken};
use crate::ids::Identity;
use crate::mqtt::authenticate::{check_username, parse_client_id};
use crate::mqtt::property_bag;
use crate::mqtt::topics::{parse_filter, parse_publish, Inbound};

/// A property bag parses, and what parses encodes back to the same properties.
pub fn property_bag(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(properties) = property_bag::parse(text) else {
        return;
    };
    let encoded = property_bag::encode(&properties);
    let again = property_bag::parse(&encoded);
    assert_eq!(
        again.as_ref(),
        Ok(&properties),
        "{text:?} encoded as {encoded:?}"
    );
}

/// Splits `data` at its first NUL into two strings (so one input reaches two fields).
fn two_fields(data: &[u8]) -> (String, String) {
    let (a, b) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    (
        String::from_utf8_lossy(a).into_owned(),
        String::from_utf8_lossy(b).into_owned(),
    )
}

/// A CONNECT's client id and user name, then a PUBLISH topic and SUBSCRIBE filter from the
/// identity they name, as the MQTT connection reads them.
pub fn topics(data: &[u8]) {
    let (client_id, rest) = two_fields(data);
    let who = match parse_client_id(&client_id) {
        Ok(who) => {
            assert!(!who.device_id.is_empty(), "client id {client_id:?}");
            who
        }
        Err(_) => Identity::for_module("dev-1", "mod-1"),
    };
    let _ = check_username(Some(&rest), HOST, &who);
    for me in [&who, &Identity::for_device("dev-1")] {
        let _ = parse_filter(&rest, me);
        match parse_publish(&rest, me) {
            Ok(Inbound::Telemetry { bag }) => {
                let _ = property_bag::parse(bag);
            }
            Ok(_) | Err(_) => {}
        }
    }
}

/// A SAS token parses; the scope it names parses; a token signed for what was parsed parses
/// back to the same resource and expiry and verifies with the key that signed it.
pub fn sas_token(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(token) = SasToken::parse(text) else {
        return;
    };
    let _ = parse_scope(&token.resource, HOST);
    let _ = token.verify(0, ["a2V5", "not base64 at all"]);
    let key = "c2VjcmV0IGtleSBmb3IgZnV6emluZw==";
    if let Some(signed) = sign(
        &token.resource,
        key,
        token.expiry,
        token.key_name.as_deref(),
    ) {
        let again = SasToken::parse(&signed)
            .unwrap_or_else(|e| panic!("{signed:?} signed from {text:?} does not parse: {e}"));
        assert_eq!(again.resource, token.resource, "{signed:?}");
        assert_eq!(again.expiry, token.expiry, "{signed:?}");
        assert_eq!(again.key_name, token.key_name, "{signed:?}");
        if token.expiry > 0 {
            again
                .verify(token.expiry - 1, [key])
                .unwrap_or_else(|e| panic!("{signed:?} does not verify: {e}"));
        }
    }
}
