//! Client side of one SCRAM-SHA-256 exchange, from a password or a ClientKey.

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use subtle::ConstantTimeEq;

use crate::{crypto, generate_nonce, parse, ClientKey, ScramError, Verifier};

enum Credential {
    /// Raw password bytes (see the crate docs on SASLprep).
    Password(Vec<u8>),
    /// A recovered ClientKey; the ServerKey, if known, lets us check the server.
    Key {
        client_key: ClientKey,
        server_key: Option<[u8; 32]>,
        /// Salt and iterations the server must announce, if known.
        expect: Option<(Vec<u8>, u32)>,
    },
}

enum State {
    /// `client_first` not called yet.
    Initial,
    /// client-first-message sent.
    SentFirst {
        nonce: String,
        client_first_bare: String,
    },
    /// client-final-message sent; waiting for the server-final-message.
    SentFinal {
        /// Expected `v=` value, when the ServerKey is known.
        server_signature: Option<[u8; 32]>,
    },
    /// The exchange failed.
    Failed,
}

/// Client side of one SCRAM-SHA-256 exchange (no channel binding).
///
/// ```text
/// let mut ex = ClientExchange::with_password("secret");
/// send SASLInitialResponse("SCRAM-SHA-256", ex.client_first());
/// send SASLResponse(ex.client_final(&authentication_sasl_continue_data)?);
/// ex.verify_server_final(&authentication_sasl_final_data)?;
/// ```
pub struct ClientExchange {
    credential: Credential,
    /// Fixed client nonce (tests only; `None` = random).
    fixed_nonce: Option<String>,
    /// Escaped user name for `n=` (empty for PostgreSQL; tests set it).
    user: String,
    /// ClientKey and ServerKey once known (derived from the password after
    /// `client_final`, or given up front).
    client_key: Option<ClientKey>,
    server_key: Option<[u8; 32]>,
    state: State,
}

impl ClientExchange {
    /// An exchange that authenticates with `password` (used as raw UTF-8 bytes).
    pub fn with_password(password: &str) -> Self {
        Self::from_credential(Credential::Password(password.as_bytes().to_vec()))
    }

    /// An exchange that authenticates with a ClientKey recovered by a
    /// [`crate::ServerExchange`], without the password.
    ///
    /// With `server_key` (from the verifier) the server's final signature is
    /// checked by [`ClientExchange::verify_server_final`]; without it the
    /// server is *not* authenticated.
    pub fn with_client_key(key: ClientKey, server_key: Option<[u8; 32]>) -> Self {
        Self::from_credential(Credential::Key {
            client_key: key,
            server_key,
            expect: None,
        })
    }

    /// Like [`ClientExchange::with_client_key`] with the verifier's ServerKey,
    /// and additionally requires the server to announce the verifier's salt
    /// and iteration count ([`ScramError::VerifierMismatch`] otherwise, e.g.
    /// when the password was changed on the server).
    pub fn with_verifier(key: ClientKey, verifier: &Verifier) -> Self {
        Self::from_credential(Credential::Key {
            client_key: key,
            server_key: Some(verifier.server_key),
            expect: Some((verifier.salt.clone(), verifier.iterations)),
        })
    }

    fn from_credential(credential: Credential) -> Self {
        ClientExchange {
            credential,
            fixed_nonce: None,
            user: String::new(),
            client_key: None,
            server_key: None,
            state: State::Initial,
        }
    }

    /// Test-only: use a fixed client nonce and user name (already escaped).
    #[cfg(test)]
    pub(crate) fn fixed(mut self, user: &str, nonce: &str) -> Self {
        self.user = user.to_owned();
        self.fixed_nonce = Some(nonce.to_owned());
        self
    }

    /// The client-first-message, `n,,n=,r=<nonce>` (the data of
    /// `SASLInitialResponse`). PostgreSQL takes the user name from the startup
    /// packet, so `n=` is empty. Calling it again restarts the exchange with
    /// a new nonce.
    pub fn client_first(&mut self) -> Vec<u8> {
        let nonce = self.fixed_nonce.clone().unwrap_or_else(generate_nonce);
        let client_first_bare = format!("n={},r={nonce}", self.user);
        let msg = format!("{}{}", parse::GS2_NO_BINDING, client_first_bare);
        self.state = State::SentFirst {
            nonce,
            client_first_bare,
        };
        msg.into_bytes()
    }

    /// Handles the server-first-message (data of `AuthenticationSASLContinue`)
    /// and returns the client-final-message (data of `SASLResponse`).
    ///
    /// Checks that the server's nonce extends ours, and that salt and
    /// iteration count are well formed. With a password this runs PBKDF2
    /// with the server's iteration count.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let State::SentFirst {
            nonce,
            client_first_bare,
        } = std::mem::replace(&mut self.state, State::Failed)
        else {
            return Err(ScramError::InvalidState(
                "client_final needs exactly one client_first before it",
            ));
        };
        let msg = parse::server_first(server_first)?;
        match msg.nonce.strip_prefix(nonce.as_str()) {
            Some(server_part) if !server_part.is_empty() => {}
            _ => return Err(ScramError::NonceMismatch),
        }
        let (client_key, server_key) = match &self.credential {
            Credential::Password(password) => {
                let keys = crypto::Keys::from_password(password, &msg.salt, msg.iterations);
                (keys.client_key, Some(keys.server_key))
            }
            Credential::Key {
                client_key,
                server_key,
                expect,
            } => {
                if let Some((salt, iterations)) = expect {
                    if *salt != msg.salt || *iterations != msg.iterations {
                        return Err(ScramError::VerifierMismatch);
                    }
                }
                (client_key.clone(), *server_key)
            }
        };
        let server_first = std::str::from_utf8(server_first)
            .map_err(|_| ScramError::Malformed("message is not UTF-8"))?;
        let without_proof = format!("c={},r={}", B64.encode(parse::GS2_NO_BINDING), msg.nonce);
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let stored_key = client_key.stored_key();
        let mut proof = *client_key.as_bytes();
        crypto::xor_into(
            &mut proof,
            &crypto::hmac(&stored_key, auth_message.as_bytes()),
        );
        let server_signature = server_key.map(|k| crypto::hmac(&k, auth_message.as_bytes()));

        self.client_key = Some(client_key);
        self.server_key = server_key;
        self.state = State::SentFinal { server_signature };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Checks the server-final-message (data of `AuthenticationSASLFinal`).
    ///
    /// `e=` becomes [`ScramError::ServerError`]; a wrong `v=` becomes
    /// [`ScramError::ServerSignatureMismatch`]. When the ServerKey is unknown
    /// (`with_client_key(key, None)`) only the syntax is checked.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let State::SentFinal { server_signature } = &self.state else {
            return Err(ScramError::InvalidState(
                "verify_server_final needs a successful client_final before it",
            ));
        };
        match parse::server_final(server_final)? {
            parse::ServerFinal::Error(e) => Err(ScramError::ServerError(e)),
            parse::ServerFinal::Verifier(got) => match server_signature {
                Some(expected) if bool::from(expected.ct_eq(&got)) => Ok(()),
                Some(_) => Err(ScramError::ServerSignatureMismatch),
                None => Ok(()),
            },
        }
    }

    /// Whether [`ClientExchange::verify_server_final`] actually authenticates
    /// the server (the ServerKey is known).
    pub fn can_verify_server(&self) -> bool {
        match &self.credential {
            Credential::Password(_) => true,
            Credential::Key { server_key, .. } => server_key.is_some(),
        }
    }

    /// The ClientKey used, once known (after `client_final` for a password).
    /// Lets a password login be turned into a reusable key.
    pub fn client_key(&self) -> Option<&ClientKey> {
        match &self.credential {
            Credential::Key { client_key, .. } => Some(client_key),
            Credential::Password(_) => self.client_key.as_ref(),
        }
    }

    /// The ServerKey, once known (after `client_final` for a password).
    pub fn server_key(&self) -> Option<&[u8; 32]> {
        match &self.credential {
            Credential::Key { server_key, .. } => server_key.as_ref(),
            Credential::Password(_) => self.server_key.as_ref(),
        }
    }
}

impl std::fmt::Debug for ClientExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credential = match self.credential {
            Credential::Password(_) => "password",
            Credential::Key { .. } => "client-key",
        };
        let state = match self.state {
            State::Initial => "initial",
            State::SentFirst { .. } => "sent-first",
            State::SentFinal { .. } => "sent-final",
            State::Failed => "failed",
        };
        f.debug_struct("ClientExchange")
            .field("credential", &credential)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
