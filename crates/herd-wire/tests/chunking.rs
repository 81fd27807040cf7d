//! Property tests: a stream of frames split at arbitrary points yields exactly the
//! frames that were encoded, with `Ok(None)` until each one is complete.
#![allow(clippy::unwrap_used)]

use herd_wire::startup::MAX_STARTUP_LEN;
use herd_wire::{encode, split_frame, split_startup};
use proptest::prelude::*;

const MAX: usize = 1 << 20;

/// One encoded frame of a few representative shapes, including arbitrary tags and bodies.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[^\\x00]{0,40}".prop_map(|s| {
            let mut b = Vec::new();
            encode::query(&mut b, &s).unwrap();
            b
        }),
        Just({
            let mut b = Vec::new();
            encode::sync(&mut b);
            b
        }),
        prop::collection::vec(
            prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
            0..6
        )
        .prop_map(|cols| {
            let c: Vec<Option<&[u8]>> = cols.iter().map(|o| o.as_deref()).collect();
            let mut b = Vec::new();
            encode::data_row(&mut b, &c).unwrap();
            b
        }),
        (any::<u8>(), prop::collection::vec(any::<u8>(), 0..80)).prop_map(|(tag, body)| {
            let mut b = vec![tag];
            let len = i32::try_from(body.len() + 4).unwrap();
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(&body);
            b
        }),
    ]
}

/// Feeds `chunks` into an accumulating buffer, splitting frames as they complete.
fn stream<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Vec<Vec<u8>> {
    let mut acc = Vec::new();
    let mut out = Vec::new();
    for chunk in chunks {
        acc.extend_from_slice(chunk);
        while let Some((f, used)) = split_frame(&acc, MAX).unwrap() {
            assert_eq!(used, f.raw.len());
            assert_eq!(used, f.body.len() + 5);
            out.push(f.raw.to_vec());
            acc.drain(..used);
        }
    }
    assert!(acc.is_empty(), "leftover bytes");
    out
}

proptest! {
    #[test]
    fn every_split_point(frames in prop::collection::vec(frame(), 1..6)) {
        let all = frames.concat();
        for k in 0..=all.len() {
            let (a, b) = all.split_at(k);
            prop_assert_eq!(&stream([a, b]), &frames);
        }
    }

    #[test]
    fn random_chunk_sizes(
        frames in prop::collection::vec(frame(), 1..12),
        sizes in prop::collection::vec(1usize..17, 1..32),
    ) {
        let all = frames.concat();
        let mut chunks = Vec::new();
        let mut rest = all.as_slice();
        for size in sizes.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (head, tail) = rest.split_at((*size).min(rest.len()));
            chunks.push(head);
            rest = tail;
        }
        prop_assert_eq!(stream(chunks), frames);
    }

    #[test]
    fn none_until_complete(frames in prop::collection::vec(frame(), 1..4)) {
        let all = frames.concat();
        let first = frames[0].len();
        for k in 0..=all.len() {
            let r = split_frame(&all[..k], MAX).unwrap();
            if k < first {
                prop_assert!(r.is_none(), "prefix {} of {}", k, first);
            } else {
                let (f, used) = r.unwrap();
                prop_assert_eq!(used, first);
                prop_assert_eq!(f.raw, frames[0].as_slice());
            }
        }
    }

    #[test]
    fn startup_then_frames(params in prop::collection::vec(("[a-z]{1,8}", "[^\\x00]{0,8}"), 0..4),
                           tail in frame()) {
        let pairs: Vec<(&str, &str)> =
            params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut all = Vec::new();
        encode::ssl_request(&mut all);
        encode::startup_message(&mut all, &pairs).unwrap();
        let startup_len = all.len() - 8;
        all.extend_from_slice(&tail);
        for k in 0..=all.len() {
            let prefix = &all[..k];
            match split_startup(prefix, MAX_STARTUP_LEN).unwrap() {
                None => prop_assert!(k < 8),
                Some((p, used)) => {
                    prop_assert_eq!(used, 8);
                    prop_assert_eq!(p, &all[..8]);
                    let rest = &prefix[used..];
                    let second = split_startup(rest, MAX_STARTUP_LEN).unwrap();
                    prop_assert_eq!(second.is_some(), rest.len() >= startup_len);
                    if let Some((_, used2)) = second {
                        let frames = &rest[used2..];
                        let third = split_frame(frames, MAX).unwrap();
                        prop_assert_eq!(third.is_some(), frames.len() == tail.len());
                    }
                }
            }
        }
    }
}
