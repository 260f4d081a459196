//! Standard Webhooks signing: the `webhook-signature` of a request, and the
//! `whsec_` secrets its key comes from.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The `webhook-signature` header: `v1,` and the base64 HMAC-SHA256 of
/// `id.timestamp.body` (Standard Webhooks).
pub fn sign(key: &[u8], id: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

/// The signing key of a `whsec_` secret: the base64 after the prefix.
pub fn signing_key(secret: &str) -> Option<Vec<u8>> {
    let encoded = secret.strip_prefix("whsec_")?;
    base64::engine::general_purpose::STANDARD.decode(encoded).ok().filter(|key| !key.is_empty())
}

/// A new secret: `whsec_` and the base64 of `random`.
pub fn encode_secret(random: &[u8]) -> String {
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(random))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's test vectors.
    #[test]
    fn signatures_match_the_standard_webhooks_reference() {
        let key = signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_round_trip_and_bad_ones_are_rejected() {
        let secret = encode_secret(&[7u8; 24]);
        assert!(secret.starts_with("whsec_"));
        assert_eq!(signing_key(&secret), Some(vec![7u8; 24]));
        assert_eq!(signing_key("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), None);
        assert_eq!(signing_key("whsec_not base64!"), None);
        assert_eq!(signing_key("whsec_"), None);
    }
}
