//! Server side of one SCRAM-SHA-256 exchange, driven by a stored verifier.

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};

use crate::{crypto, generate_nonce, parse, ClientKey, ScramError, Verifier};

enum State {
    /// Waiting for the client-first-message.
    Initial,
    /// server-first-message sent, waiting for the client-final-message.
    SentFirst {
        gs2_header: String,
        nonce: String,
        client_first_bare: String,
        server_first: String,
    },
    /// Finished (successfully or not); no further step is possible.
    Done,
}

/// Server side of one SCRAM-SHA-256 exchange.
///
/// ```text
/// let mut ex = ServerExchange::new(verifier);
/// let server_first = ex.server_first(sasl_initial_response_data)?;   // -> AuthenticationSASLContinue
/// let (server_final, key) = ex.server_final(sasl_response_data)?;    // -> AuthenticationSASLFinal
/// ```
///
/// Any error ends the exchange; the caller should then fail the login with a
/// generic "password authentication failed" error.
pub struct ServerExchange {
    verifier: Verifier,
    server_nonce: String,
    /// Always fail (unknown user, see [`ServerExchange::mock`]).
    doomed: bool,
    state: State,
}

impl ServerExchange {
    /// Starts an exchange for the user whose verifier is `verifier`, with a
    /// fresh random server nonce.
    pub fn new(verifier: Verifier) -> Self {
        Self::with_nonce(verifier, generate_nonce())
    }

    /// Test-only: an exchange with a fixed server nonce.
    #[cfg(test)]
    pub(crate) fn with_fixed_nonce(verifier: Verifier, server_nonce: &str) -> Self {
        Self::with_nonce(verifier, server_nonce.to_owned())
    }

    fn with_nonce(verifier: Verifier, server_nonce: String) -> Self {
        ServerExchange {
            verifier,
            server_nonce,
            doomed: false,
            state: State::Initial,
        }
    }

    /// An exchange for a user that does not exist (or has no SCRAM verifier)
    /// which looks like a real one and always ends in
    /// [`ScramError::AuthFailed`], so that clients cannot probe user names.
    ///
    /// The salt is derived from `user` and the proxy-wide `secret` so it is
    /// stable across attempts, like a real user's salt.
    pub fn mock(user: &str, secret: &[u8]) -> Self {
        let digest = crypto::hmac(secret, user.as_bytes());
        let mut keys = [0u8; 64];
        crypto::random_bytes(&mut keys);
        let mut stored_key = [0u8; 32];
        let mut server_key = [0u8; 32];
        stored_key.copy_from_slice(&keys[..32]);
        server_key.copy_from_slice(&keys[32..]);
        let verifier = Verifier {
            iterations: crate::DEFAULT_ITERATIONS,
            salt: digest[..crate::DEFAULT_SALT_LEN].to_vec(),
            stored_key,
            server_key,
        };
        let mut ex = Self::new(verifier);
        ex.doomed = true;
        ex
    }

    /// Handles the client-first-message (the data of `SASLInitialResponse`,
    /// e.g. `n,,n=,r=<nonce>`) and returns the server-first-message
    /// (`r=<client nonce><server nonce>,s=<salt>,i=<iterations>`).
    pub fn server_first(&mut self, client_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, State::Initial) {
            self.state = State::Done;
            return Err(ScramError::InvalidState("server_first called twice"));
        }
        self.state = State::Done;
        let msg = parse::client_first(client_first)?;
        // Built with pushes, not `format!`: its machinery cost more than the rest of a login's
        // bookkeeping (a connect-per-transaction client logs in on every transaction).
        let mut nonce = String::with_capacity(msg.nonce.len() + self.server_nonce.len());
        nonce.push_str(msg.nonce);
        nonce.push_str(&self.server_nonce);
        let mut server_first = String::with_capacity(nonce.len() + 64);
        server_first.push_str("r=");
        server_first.push_str(&nonce);
        server_first.push_str(",s=");
        B64.encode_string(&self.verifier.salt, &mut server_first);
        server_first.push_str(",i=");
        server_first.push_str(&self.verifier.iterations.to_string());
        self.state = State::SentFirst {
            gs2_header: msg.gs2_header.to_owned(),
            nonce,
            client_first_bare: msg.bare.to_owned(),
            server_first: server_first.clone(),
        };
        Ok(server_first.into_bytes())
    }

    /// Handles the client-final-message (the data of `SASLResponse`). On a
    /// valid proof returns the server-final-message (`v=<signature>`) and the
    /// client's recovered [`ClientKey`]; on a wrong proof returns
    /// [`ScramError::AuthFailed`].
    pub fn server_final(
        &mut self,
        client_final: &[u8],
    ) -> Result<(Vec<u8>, ClientKey), ScramError> {
        let State::SentFirst {
            gs2_header,
            nonce,
            client_first_bare,
            server_first,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(ScramError::InvalidState(
                "server_final needs exactly one server_first before it",
            ));
        };
        let msg = parse::client_final(client_final)?;
        if msg.channel_binding != gs2_header.as_bytes() {
            return Err(ScramError::ChannelBindingMismatch);
        }
        if msg.nonce != nonce {
            return Err(ScramError::NonceMismatch);
        }
        let auth_message = [
            client_first_bare.as_str(),
            server_first.as_str(),
            msg.without_proof,
        ]
        .join(",");
        let client_signature = crypto::hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let mut key = msg.proof;
        crypto::xor_into(&mut key, &client_signature);
        let client_key = ClientKey::from_bytes(key);
        let ok = client_key.matches(&self.verifier) & !self.doomed;
        if !ok {
            return Err(ScramError::AuthFailed);
        }
        let server_signature = crypto::hmac(&self.verifier.server_key, auth_message.as_bytes());
        let mut server_final = String::from("v=");
        B64.encode_string(server_signature, &mut server_final);
        Ok((server_final.into_bytes(), client_key))
    }
}

impl std::fmt::Debug for ServerExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Initial => "initial",
            State::SentFirst { .. } => "sent-first",
            State::Done => "done",
        };
        f.debug_struct("ServerExchange")
            .field("verifier", &self.verifier)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
