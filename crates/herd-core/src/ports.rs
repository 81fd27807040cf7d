//! Where scratch clusters (tests, benchmarks) put their ports.
//!
//! Scratch ports must stay below the kernel's ephemeral range (Linux default 32768–60999):
//! a port in that range can be taken as the *source* port of any outgoing connection between
//! the moment it was checked free and the moment PostgreSQL binds it, which made a CI run fail
//! with "could not bind IPv4 address: Address already in use".

use std::ops::Range;

/// Ports scratch clusters may use: above the registered services people run locally and
/// below Linux's default ephemeral range.
pub const SCRATCH_PORTS: Range<u16> = 10_000..32_000;

/// Distance from a block's base port to its HTTP API port (Herd's default: port + 100).
pub const API_PORT_OFFSET: u16 = 100;

/// The `index`-th candidate base port of a block of `step` ports for a process seeded with
/// `seed` (its pid, say). Candidates of one seed are `step` apart; different seeds start far
/// apart so parallel processes rarely probe the same block. The block and its API port
/// (`base + API_PORT_OFFSET`) always lie inside [`SCRATCH_PORTS`].
pub fn scratch_port_base(seed: u32, index: u32, step: u16) -> u16 {
    let step = u32::from(step.max(1));
    let room = u32::from(API_PORT_OFFSET.max(step as u16)) + 1;
    let width = u32::from(SCRATCH_PORTS.end - SCRATCH_PORTS.start) - room;
    // Seeds land on multiples of 200 so two processes' first blocks do not overlap.
    let offset =
        (u64::from(seed % 100) * 200 + u64::from(index) * u64::from(step)) % u64::from(width);
    SCRATCH_PORTS.start + offset as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_and_api_ports_stay_in_the_scratch_range() {
        for seed in [0, 1, 99, 100, 4_000_000, u32::MAX] {
            for index in [0, 1, 7, 1_000, 100_000, u32::MAX] {
                for step in [1, 8, 12, 40] {
                    let base = scratch_port_base(seed, index, step);
                    assert!(
                        SCRATCH_PORTS.contains(&base),
                        "{seed} {index} {step}: {base}"
                    );
                    assert!(SCRATCH_PORTS.contains(&(base + step - 1)));
                    assert!(SCRATCH_PORTS.contains(&(base + API_PORT_OFFSET)));
                }
            }
        }
    }

    #[test]
    fn consecutive_candidates_do_not_overlap() {
        let a = scratch_port_base(42, 0, 12);
        let b = scratch_port_base(42, 1, 12);
        assert_eq!(b - a, 12);
        assert_ne!(scratch_port_base(1, 0, 12), scratch_port_base(2, 0, 12));
    }
}
