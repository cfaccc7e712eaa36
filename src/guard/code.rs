//! One-time codes: drawn from the OS-seeded CSPRNG, stored only as an HMAC.

use hmac::{Hmac, KeyInit, Mac};
use rand::RngExt;
use sha2::Sha256;

/// A code of `length` random decimal digits.
pub fn generate(length: u32) -> String {
    let mut rng = rand::rng();
    (0..length)
        .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
        .collect()
}

/// Hex HMAC-SHA256 of `phone:code`; binding the phone means a MAC leaked for
/// one number is worthless for another.
pub fn mac(secret: &[u8], phone_e164: &str, code: &str) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .expect("HMAC-SHA256 accepts keys of any length");
    mac.update(phone_e164.as_bytes());
    mac.update(b":");
    mac.update(code.as_bytes());
    crate::hex::lower(&mac.finalize().into_bytes())
}

/// A fresh code key: 32 random bytes as 64 hex digits.
pub fn random_secret() -> String {
    crate::hex::lower(&rand::rng().random::<[u8; 32]>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_digits_of_the_requested_length() {
        for len in [4, 6, 10] {
            let code = generate(len);
            assert_eq!(code.len(), len as usize);
            assert!(code.chars().all(|c| c.is_ascii_digit()));
        }
    }

    #[test]
    fn the_mac_depends_on_secret_phone_and_code() {
        let a = mac(b"k", "+1", "123456");
        assert_eq!(a.len(), 64);
        assert_ne!(a, mac(b"k2", "+1", "123456"));
        assert_ne!(a, mac(b"k", "+2", "123456"));
        assert_ne!(a, mac(b"k", "+1", "123457"));
        assert_eq!(a, mac(b"k", "+1", "123456"));
    }
}
