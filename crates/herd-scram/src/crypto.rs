//! SCRAM-SHA-256 primitives: H, HMAC, PBKDF2 (RFC 8018, one 32-byte block) and key derivation.

use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::ClientKey;

type HmacSha256 = Hmac<Sha256>;

/// `H(data)`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(&Sha256::digest(data));
    out
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC is defined for keys of any length; this cannot fail.
    <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

fn finish(mac: HmacSha256) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(&mac.finalize().into_bytes());
    out
}

/// `HMAC(key, data)`.
pub(crate) fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = keyed(key);
    mac.update(data);
    finish(mac)
}

/// `Hi(password, salt, i)` of RFC 5802, i.e. PBKDF2-HMAC-SHA-256 with a 32-byte output.
pub(crate) fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let prf = keyed(password);
    let mut mac = prf.clone();
    mac.update(salt);
    mac.update(&1u32.to_be_bytes());
    let mut u = finish(mac);
    let mut result = u;
    for _ in 1..iterations {
        let mut mac = prf.clone();
        mac.update(&u);
        u = finish(mac);
        xor_into(&mut result, &u);
    }
    result
}

/// `a ^= b`.
pub(crate) fn xor_into(a: &mut [u8; 32], b: &[u8; 32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}

/// Fills `buf` from the operating system's CSPRNG.
pub(crate) fn random_bytes(buf: &mut [u8]) {
    rand::rngs::OsRng.fill_bytes(buf);
}

/// ClientKey and ServerKey derived from a password.
pub(crate) struct Keys {
    pub(crate) client_key: ClientKey,
    pub(crate) server_key: [u8; 32],
}

impl Keys {
    pub(crate) fn from_password(password: &[u8], salt: &[u8], iterations: u32) -> Keys {
        let salted = salted_password(password, salt, iterations);
        Keys {
            client_key: ClientKey::from_bytes(hmac(&salted, b"Client Key")),
            server_key: hmac(&salted, b"Server Key"),
        }
    }
}
