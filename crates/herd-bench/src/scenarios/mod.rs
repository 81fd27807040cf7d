//! The scenarios of the registry in the crate root.

pub mod backup;
pub mod backup_report;
pub mod bandwidth;
pub mod bandwidth_copies;
pub mod bandwidth_report;
pub mod commit_modes;
pub mod commit_waits;
mod dataset;
pub mod failover;
pub mod failover_hosts;
pub mod failover_shards;
mod failover_shards_io;
mod lab_hosts;
mod lab_teardown;
pub mod lag;
pub mod lag_report;
mod lag_sampler;
pub mod proxy;
mod proxy_apart;
mod proxy_derived;
mod proxy_login;
pub mod proxy_targets;
pub mod read_scaling;
pub mod read_scaling_report;
pub mod shard_move;
pub mod shard_move_report;
pub mod sharding;
mod sharding_mix;
pub mod sharding_report;

/// The runs of `rounds` rounds over `a` × `b` combinations, as (round, i, k): both orders
/// rotate every round, so no combination always runs first or last.
pub(crate) fn rotated_jobs(rounds: u32, a: usize, b: usize) -> Vec<(usize, usize, usize)> {
    let mut jobs = Vec::new();
    for round in 0..rounds as usize {
        for i in 0..a {
            for k in 0..b {
                jobs.push((round, (i + round) % a, (k + round) % b));
            }
        }
    }
    jobs
}

#[cfg(test)]
mod tests {
    #[test]
    fn rotation_covers_every_pair_each_round() {
        let jobs = super::rotated_jobs(2, 3, 2);
        assert_eq!(jobs.len(), 12);
        assert_eq!(&jobs[..2], &[(0, 0, 0), (0, 0, 1)]);
        assert_eq!(jobs[6], (1, 1, 1));
        for round in 0..2 {
            let mut pairs: Vec<_> = jobs
                .iter()
                .filter(|j| j.0 == round)
                .map(|j| (j.1, j.2))
                .collect();
            pairs.sort();
            pairs.dedup();
            assert_eq!(pairs.len(), 6);
        }
    }
}
