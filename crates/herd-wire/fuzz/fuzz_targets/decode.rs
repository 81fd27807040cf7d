//! Feeds arbitrary bytes to every splitter and decoder; any panic is a bug.
#![no_main]

use herd_wire::backend::{
    Authentication, BackendKeyData, CommandComplete, DataRow, ErrorFields, ParameterStatus,
    ReadyForQuery,
};
use herd_wire::frontend::{
    password_message, sasl_response, Bind, Close, Describe, Execute, Parse, Query,
    SaslInitialResponse,
};
use herd_wire::startup::MAX_STARTUP_LEN;
use herd_wire::{encode, parse_startup, split_frame, split_startup};
use libfuzzer_sys::fuzz_target;

/// Small enough that the length checks are exercised, large enough for real messages.
const MAX_FRAME: usize = 1 << 16;

fn decode_body(body: &[u8]) {
    let _ = Query::decode(body);
    let _ = Parse::decode(body);
    let _ = Describe::decode(body);
    let _ = Close::decode(body);
    let _ = Execute::decode(body);
    let _ = SaslInitialResponse::decode(body);
    let _ = sasl_response(body);
    let _ = password_message(body);
    let _ = ReadyForQuery::decode(body);
    let _ = ParameterStatus::decode(body);
    let _ = BackendKeyData::decode(body);
    let _ = Authentication::decode(body);
    let _ = CommandComplete::decode(body);
    let _ = DataRow::decode(body);
    if let Ok(fields) = ErrorFields::decode(body) {
        let _ = (fields.severity(), fields.code(), fields.message());
        for _ in fields.iter() {}
    }
    // Renaming a Bind must keep everything after the names byte for byte.
    if let Ok(bind) = Bind::decode(body) {
        let mut out = Vec::new();
        if encode::bind_renamed(&mut out, bind.portal, "renamed", bind.rest).is_ok() {
            if let Ok(Some((frame, _))) = split_frame(&out, usize::MAX) {
                if let Ok(again) = Bind::decode(frame.body) {
                    assert_eq!(again.rest, bind.rest);
                    assert_eq!(again.statement, b"renamed");
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = parse_startup(data);
    let mut rest = data;
    if let Ok(Some((packet, used))) = split_startup(rest, MAX_STARTUP_LEN) {
        let _ = parse_startup(packet);
        rest = rest.get(used..).unwrap_or_default();
    }
    while let Ok(Some((frame, used))) = split_frame(rest, MAX_FRAME) {
        assert_eq!(frame.raw.len(), used);
        decode_body(frame.body);
        rest = rest.get(used..).unwrap_or_default();
    }
    decode_body(data);
});
