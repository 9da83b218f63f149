//! (f) Redis as deployed: a run's wall time and the handoff gap on a Sentinel
//! deployment (its primary asked of the Sentinels, then WAIT for its replica)
//! and on a three-primary Cluster, against a single node in the same
//! interleaved runs; and WAIT's own cost, on a single node with a replica.

use std::ffi::OsString;

use crate::builds::Build;
use crate::handoff::Target;
use crate::lockers::Locker;
use crate::queue::{Arrival, Hold};
use crate::report::Outcome;
use crate::single::interleaved_medians;
use crate::stats::{ms, ratio_text};
use crate::support::cluster::RedisCluster;
use crate::support::sentinel::SentinelDeployment;
use crate::support::{self, RedisServer};
use crate::{Bench, QUEUE, QUEUE_ROUNDS, QUEUE_SETTLE};

/// Runs of `lockrun -- true` per Redis deployment.
const DEPLOYED_RUNS: usize = 300;
/// The target: a deployment's run and handoff against a single node's.
const DEPLOYED_RATIO: f64 = 1.2;

impl Bench {
    pub(crate) fn deployed(&mut self, build: &Build) {
        let lockrun = |url: String, replicas: &str| Locker::Lockrun {
            build: build.clone(),
            backend: "redis",
            flags: [
                "--backend",
                "redis",
                "--redis-url",
                &url,
                "--redis-replicas",
                replicas,
            ]
            .map(OsString::from)
            .to_vec(),
        };
        let what = |label: &str| format!("(f) per-run wall time, redis {label}");
        let target = format!("≤ {DEPLOYED_RATIO:.1}× single node");
        let single = RedisServer::start(&[]);
        let sentinel = SentinelDeployment::start(None);
        let cluster = RedisCluster::start();
        let (Some(single), Some(sentinel), Some(cluster)) = (single, sentinel, cluster) else {
            let why = "redis-server or redis-sentinel is not installed or did not start";
            self.outcomes
                .push(Outcome::not_measured(what("as deployed"), &target, why));
            return;
        };
        let with_replica = RedisServer::start(&[]).expect("a second redis-server");
        let port = with_replica.port().to_string();
        let replica = RedisServer::start(&["--replicaof", "127.0.0.1", &port]).expect("a replica");
        // WAIT counts a replica only once it is in sync.
        support::wait_until("the replica to be in sync", || {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut replica.client())
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        let contenders = [
            ("single node", lockrun(single.url(), "0")),
            (
                "single node + WAIT 1 (a replica)",
                lockrun(with_replica.url(), "1"),
            ),
            ("Sentinel, --redis-replicas 0", lockrun(sentinel.url(), "0")),
            ("Sentinel (default: WAIT 1)", lockrun(sentinel.url(), "1")),
            ("Cluster (3 primaries)", lockrun(cluster.url(1), "0")),
        ];
        let lockers: Vec<Locker> = contenders
            .iter()
            .map(|(_, locker)| locker.clone())
            .collect();
        let medians = interleaved_medians(&lockers, "deployed", DEPLOYED_RUNS);
        for ((label, _), &measured) in contenders.iter().zip(&medians).skip(1) {
            self.against_single(what(label), measured, medians[0], &target);
        }
        // The handoff gap, in the queue rounds of (c), the three deployments interleaved.
        let handoffs: Vec<(&str, Result<Locker, String>, Target)> = [0, 3, 4]
            .into_iter()
            .map(|at| (contenders[at].0, Ok(contenders[at].1.clone()), Target::None))
            .collect();
        let gaps = self.queue_gaps(
            &handoffs,
            1,
            Arrival::Settle(QUEUE_SETTLE),
            (Hold::Fixed, QUEUE_ROUNDS),
        );
        let Ok(single_gaps) = &gaps[0] else {
            self.note("(f) handoff: the single node's queue did not finish".into());
            return;
        };
        for ((label, _, _), measured) in handoffs.iter().zip(&gaps).skip(1) {
            let what = format!(
                "(f) handoff gap, redis {label}, median of {QUEUE_ROUNDS}x{QUEUE} handoffs"
            );
            match measured {
                Ok(gaps) => self.against_single(what, gaps.median, single_gaps.median, &target),
                Err(why) => self
                    .outcomes
                    .push(Outcome::not_measured(what, &target, why)),
            }
        }
    }

    fn against_single(
        &mut self,
        what: String,
        measured: std::time::Duration,
        single: std::time::Duration,
        target: &str,
    ) {
        println!(
            "{what}: {} against a single node's {}",
            ms(measured),
            ms(single)
        );
        self.outcomes.push(Outcome {
            what,
            measured: ms(measured),
            baseline: ms(single),
            ratio: ratio_text(measured, single),
            target: target.to_owned(),
            pass: Some(measured.as_secs_f64() <= DEPLOYED_RATIO * single.as_secs_f64()),
        });
    }
}
