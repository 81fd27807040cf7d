//! Who may read an agent's member record or ask it the failsafe question (issue #42): only
//! agents, proxies and operators of the same cluster, proved by a key every one of them holds.
//!
//! The key is derived from the cluster's superuser password (HMAC-SHA256 of it with a fixed
//! label), which every agent already has in its `secrets/` directory (0600) and which a
//! secrets copy carries to a new host: no new file to distribute, and no password on the
//! wire. A request carries `Authorization: Herd-HMAC nonce=<hex>, sig=<hex>`, the signature
//! an HMAC of the method, path and a fresh random nonce; the agent refuses a request without
//! it (401), with a wrong signature or a nonce it has seen (403), and logs each refusal. The
//! answer is signed too (`X-Herd-Answer`: an HMAC of what was answered, the request's nonce
//! and the body), so the asker knows a key holder answered *this* question: a forged failsafe
//! confirmation from outside the cluster cannot keep an isolated primary serving.
//!
//! Plain HTTP still shows the member record to whoever can capture the traffic; TLS on the
//! agents' API is the next slice of issue #42.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;

pub mod seal;

type HmacSha256 = hmac::Hmac<Sha256>;

/// The request header that carries the signature.
pub const AUTHORIZATION: &str = "authorization";
/// The answer header that carries the agent's signature of its answer.
pub const ANSWER: &str = "x-herd-answer";
/// The scheme name in [`AUTHORIZATION`].
const SCHEME: &str = "Herd-HMAC";

/// The cluster's key for the agents' API.
#[derive(Clone)]
pub struct ApiKey([u8; 32]);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Herd-HMAC …` header (401).
    Missing,
    /// A header that does not parse (403).
    Malformed,
    /// A signature made with another key, or of another request (403).
    BadSignature,
    /// A nonce this agent has already accepted (403): a replayed request.
    Replayed,
}

impl Refusal {
    /// The HTTP status of the refusal.
    pub fn status(self) -> u16 {
        match self {
            Refusal::Missing => 401,
            _ => 403,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::Missing => "no Herd-HMAC authorization",
            Refusal::Malformed => "a malformed Herd-HMAC authorization",
            Refusal::BadSignature => "a signature made without the cluster's key",
            Refusal::Replayed => "a replayed request (nonce seen before)",
        })
    }
}

impl ApiKey {
    /// The key of the cluster whose superuser password is `password`.
    pub fn from_password(password: &str) -> ApiKey {
        let mut mac = new_mac(password.as_bytes());
        mac.update(b"herd agent API key v1");
        ApiKey(mac.finalize().into_bytes().into())
    }

    /// A signed `Authorization` value for `method` and `path`, and its nonce.
    pub fn sign(&self, method: &str, path: &str) -> (String, String) {
        let mut raw = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut raw);
        let nonce = hex(&raw);
        let sig = hex(&self.request_mac(method, path, &nonce));
        let header = format!("{SCHEME} nonce={nonce}, sig={sig}");
        (nonce, header)
    }

    /// Checks a request's `Authorization` value; its nonce when it is genuine and new.
    pub fn verify(
        &self,
        method: &str,
        path: &str,
        header: Option<&str>,
        nonces: &mut Nonces,
    ) -> Result<String, Refusal> {
        let header = header.ok_or(Refusal::Missing)?;
        let rest = header
            .strip_prefix(SCHEME)
            .ok_or(Refusal::Missing)?
            .trim_start();
        let (mut nonce, mut sig) = (None, None);
        for part in rest.split(',') {
            match part.trim().split_once('=') {
                Some(("nonce", v)) => nonce = Some(v.to_string()),
                Some(("sig", v)) => sig = Some(v.to_string()),
                _ => return Err(Refusal::Malformed),
            }
        }
        let (Some(nonce), Some(sig)) = (nonce, sig) else {
            return Err(Refusal::Malformed);
        };
        if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Refusal::Malformed);
        }
        let sig = unhex(&sig).ok_or(Refusal::Malformed)?;
        let mut mac = new_mac(&self.0);
        mac.update(request_text(method, path, &nonce).as_bytes());
        mac.verify_slice(&sig).map_err(|_| Refusal::BadSignature)?;
        if !nonces.insert(&nonce, Instant::now()) {
            return Err(Refusal::Replayed);
        }
        Ok(nonce)
    }

    /// The signature of an answer: `what` was answered to the request with `nonce`, with
    /// `body`.
    pub fn answer(&self, what: &str, nonce: &str, body: &[u8]) -> String {
        hex(&self.answer_mac(what, nonce, body))
    }

    /// Whether `tag` (an [`ANSWER`] header) is this key's signature of that answer.
    pub fn answered(&self, what: &str, nonce: &str, body: &[u8], tag: Option<&str>) -> bool {
        let Some(sig) = tag.and_then(unhex) else {
            return false;
        };
        let mut mac = new_mac(&self.0);
        mac.update(answer_text(what, nonce).as_bytes());
        mac.update(body);
        mac.verify_slice(&sig).is_ok()
    }

    fn request_mac(&self, method: &str, path: &str, nonce: &str) -> Vec<u8> {
        let mut mac = new_mac(&self.0);
        mac.update(request_text(method, path, nonce).as_bytes());
        mac.finalize().into_bytes().to_vec()
    }

    fn answer_mac(&self, what: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
        let mut mac = new_mac(&self.0);
        mac.update(answer_text(what, nonce).as_bytes());
        mac.update(body);
        mac.finalize().into_bytes().to_vec()
    }
}

fn new_mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length.
    <HmacSha256 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

fn request_text(method: &str, path: &str, nonce: &str) -> String {
    format!("herd-api-v1\n{method}\n{path}\n{nonce}")
}

fn answer_text(what: &str, nonce: &str) -> String {
    format!("herd-answer-v1\n{what}\n{nonce}\n")
}

/// Nonces accepted lately, so a captured request cannot be sent again: kept for
/// [`Nonces::KEEP`], at most [`Nonces::MAX`] (the oldest dropped first when full).
#[derive(Debug, Default)]
pub struct Nonces {
    seen: HashMap<String, Instant>,
}

impl Nonces {
    /// How long a nonce is remembered.
    pub const KEEP: Duration = Duration::from_secs(600);
    /// The most nonces remembered.
    pub const MAX: usize = 10_000;

    /// Records `nonce` at `now`; false when it was seen within [`Nonces::KEEP`].
    pub fn insert(&mut self, nonce: &str, now: Instant) -> bool {
        self.seen
            .retain(|_, at| now.saturating_duration_since(*at) < Self::KEEP);
        if self.seen.contains_key(nonce) {
            return false;
        }
        if self.seen.len() >= Self::MAX {
            if let Some(oldest) = self
                .seen
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(n, _)| n.clone())
            {
                self.seen.remove(&oldest);
            }
        }
        self.seen.insert(nonce.to_string(), now);
        true
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_signed_with_the_key_passes_once() {
        let key = ApiKey::from_password("secret");
        let mut nonces = Nonces::default();
        let (nonce, header) = key.sign("POST", "/failsafe");
        assert_eq!(
            key.verify("POST", "/failsafe", Some(&header), &mut nonces),
            Ok(nonce)
        );
        // The same request again is a replay.
        assert_eq!(
            key.verify("POST", "/failsafe", Some(&header), &mut nonces),
            Err(Refusal::Replayed)
        );
    }

    #[test]
    fn refusals() {
        let key = ApiKey::from_password("secret");
        let other = ApiKey::from_password("another cluster");
        let mut nonces = Nonces::default();
        let (_, signed) = key.sign("GET", "/member");
        let (_, foreign) = other.sign("GET", "/member");
        let cases: Vec<(Option<&str>, &str, Refusal)> = vec![
            (None, "/member", Refusal::Missing),
            (Some("Bearer abc"), "/member", Refusal::Missing),
            (
                Some("Herd-HMAC nonce=zz, sig=00"),
                "/member",
                Refusal::Malformed,
            ),
            (Some("Herd-HMAC sig=00"), "/member", Refusal::Malformed),
            (Some(&foreign), "/member", Refusal::BadSignature),
            // Signed for another path.
            (Some(&signed), "/failsafe", Refusal::BadSignature),
        ];
        for (header, path, want) in cases {
            assert_eq!(
                key.verify("GET", path, header, &mut nonces),
                Err(want),
                "{header:?} {path}"
            );
        }
        assert_eq!(Refusal::Missing.status(), 401);
        assert_eq!(Refusal::BadSignature.status(), 403);
    }

    #[test]
    fn answers_are_tied_to_the_key_the_question_and_the_body() {
        let key = ApiKey::from_password("secret");
        let tag = key.answer("failsafe", "n1", b"");
        assert!(key.answered("failsafe", "n1", b"", Some(&tag)));
        assert!(!key.answered("failsafe", "n2", b"", Some(&tag)));
        assert!(!key.answered("member", "n1", b"", Some(&tag)));
        assert!(!key.answered("failsafe", "n1", b"x", Some(&tag)));
        assert!(!key.answered("failsafe", "n1", b"", None));
        let forged = ApiKey::from_password("guess").answer("failsafe", "n1", b"");
        assert!(!key.answered("failsafe", "n1", b"", Some(&forged)));
    }

    #[test]
    fn nonces_are_forgotten_after_a_while_and_bounded() {
        let mut nonces = Nonces::default();
        let t0 = Instant::now();
        assert!(nonces.insert("a", t0));
        assert!(!nonces.insert("a", t0 + Duration::from_secs(1)));
        assert!(nonces.insert("a", t0 + Nonces::KEEP + Duration::from_secs(1)));
        for i in 0..Nonces::MAX + 5 {
            nonces.insert(&i.to_string(), t0 + Nonces::KEEP * 2);
        }
        assert!(nonces.seen.len() <= Nonces::MAX);
    }
}
