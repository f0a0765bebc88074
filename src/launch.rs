//! Where this process stands among the processes of a job: its rank, the world and its GPU, as
//! torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`) or Slurm (`SLURM_PROCID`, `SLURM_NTASKS`,
//! `SLURM_LOCALID`) describe it in the environment.

use std::fmt;

use crate::error::{Error, Result};
use crate::options::{DecodeOptions, Device, Shard};

/// Which launcher's variables describe the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Launcher {
    /// `torchrun` (and `torch.distributed.launch`): `RANK`, `WORLD_SIZE`, `LOCAL_RANK`.
    Torchrun,
    /// Slurm's `srun`: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm",
        })
    }
}

/// This process's place in a job of several: its rank among `world` processes, and its rank on
/// this machine, which picks its GPU (`cuda:LOCAL_RANK`, as PyTorch's DDP examples do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Launch {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// Number of processes.
    pub world: usize,
    /// This process's rank on its machine.
    pub local_rank: usize,
    /// How many of the job's processes run on this machine, where the launcher says
    /// (torchrun's `LOCAL_WORLD_SIZE`, Slurm's `SLURM_NTASKS_PER_NODE`).
    pub local_world: Option<usize>,
    /// Whose variables these are.
    pub launcher: Launcher,
}

/// The variables of each launcher: rank, world, local rank...
const TORCHRUN: [&str; 3] = ["RANK", "WORLD_SIZE", "LOCAL_RANK"];
const SLURM: [&str; 3] = ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"];

/// ...and the processes on this machine, which they may leave out.
const TORCHRUN_LOCAL_WORLD: &str = "LOCAL_WORLD_SIZE";
const SLURM_LOCAL_WORLD: &str = "SLURM_NTASKS_PER_NODE";

impl Launch {
    /// The launch the environment describes: torchrun's variables when any is set (a torchrun
    /// started by `srun` sets both, and its own are the processes'), else Slurm's. An error
    /// names the variables when none is set, when some are missing or not numbers, or when the
    /// rank is not below the world.
    pub fn from_env() -> Result<Launch> {
        Launch::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Launch::from_env`] with the variables `var` gives.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let set = |names: &[&str; 3]| names.iter().any(|n| var(n).is_some());
        let (launcher, names, local_world_name) = if set(&TORCHRUN) {
            (Launcher::Torchrun, TORCHRUN, TORCHRUN_LOCAL_WORLD)
        } else if set(&SLURM) {
            (Launcher::Slurm, SLURM, SLURM_LOCAL_WORLD)
        } else {
            return Err(Error::invalid(
                "shard",
                format!(
                    "no launcher in the environment: torchrun sets {}, Slurm sets {}",
                    TORCHRUN.join("/"),
                    SLURM.join("/")
                ),
            ));
        };
        let parse = |name: &str, value: String| -> Result<usize> {
            value
                .trim()
                .parse()
                .map_err(|_| Error::invalid("shard", format!("{name}={value:?} is not a number")))
        };
        let number = |name: &str| -> Result<usize> {
            let value = var(name).ok_or_else(|| {
                Error::invalid(
                    "shard",
                    format!(
                        "{launcher} variables incomplete: {name} is not set ({} are needed)",
                        names.join(", ")
                    ),
                )
            })?;
            parse(name, value)
        };
        let launch = Launch {
            rank: number(names[0])?,
            world: number(names[1])?,
            local_rank: number(names[2])?,
            local_world: var(local_world_name)
                .map(|value| parse(local_world_name, value))
                .transpose()?,
            launcher,
        };
        if launch.world == 0 || launch.rank >= launch.world {
            return Err(Error::invalid(
                "shard",
                format!(
                    "{}={} and {}={}: the rank must be below the number of processes",
                    names[0], launch.rank, names[1], launch.world
                ),
            ));
        }
        if launch.local_rank > launch.rank {
            return Err(Error::invalid(
                "shard",
                format!(
                    "{}={} is above {}={}: no process has more ranks on its machine than in all",
                    names[2], launch.local_rank, names[0], launch.rank
                ),
            ));
        }
        if let Some(local_world) = launch.local_world {
            if launch.local_rank >= local_world {
                return Err(Error::invalid(
                    "shard",
                    format!(
                        "{}={} and {local_world_name}={local_world}: the rank on this machine must \
                         be below the number of processes on it",
                        names[2], launch.local_rank
                    ),
                ));
            }
        }
        Ok(launch)
    }

    /// This process's part of the source.
    pub fn shard(&self) -> Shard {
        Shard::new(self.rank, self.world)
    }

    /// `decode` for this process: with [`crate::SHARED_MACHINE_MIN_RANKS`] processes of the job
    /// or more on its machine, the GPU lane's share kept at
    /// [`crate::SHARED_MACHINE_MIN_GPU_SHARE`] or more, unless a floor was set
    /// ([`DecodeOptions::ranks_on_machine`]).
    pub fn decode_options(&self, decode: DecodeOptions) -> DecodeOptions {
        decode.ranks_on_machine(self.local_world.unwrap_or(1))
    }

    /// This process's GPU: `cuda:LOCAL_RANK`.
    pub fn device(&self) -> Device {
        Device::Cuda(self.local_rank)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(vars: &[(&str, &str)]) -> Result<Launch> {
        Launch::from_vars(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    fn reason(result: Result<Launch>) -> String {
        match result {
            Err(Error::InvalidOption { option, reason }) => {
                assert_eq!(option, "shard");
                reason
            }
            other => panic!("expected an error naming the shard, got {other:?}"),
        }
    }

    #[test]
    fn torchrun_and_slurm_variables_are_read() {
        let t = launch(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")]).expect("ok");
        assert_eq!((t.rank, t.world, t.local_rank), (3, 8, 1));
        assert_eq!(t.launcher, Launcher::Torchrun);
        assert_eq!(t.shard(), Shard::new(3, 8));
        assert_eq!(t.device(), Device::Cuda(1));
        let s = launch(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_LOCALID", "1"),
        ])
        .expect("ok");
        assert_eq!((s.rank, s.world, s.local_rank), (5, 6, 1));
        assert_eq!(s.launcher, Launcher::Slurm);
        // torchrun started by srun: torchrun's variables are the processes'.
        let both = launch(&[
            ("RANK", "9"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "1"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
        ])
        .expect("ok");
        assert_eq!((both.rank, both.world), (9, 16));
        assert_eq!(
            (t.local_world, s.local_world, both.local_world),
            (None, None, None)
        );
    }

    /// Four processes or more on this machine, where the launcher says, put a floor under the
    /// GPU lane's share; fewer, or a floor already set, keep their own.
    #[test]
    fn four_ranks_or_more_on_the_machine_put_a_floor_under_the_gpu_share() {
        let four = launch(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
        ])
        .expect("ok");
        assert_eq!(four.local_world, Some(4));
        let floor = four.decode_options(DecodeOptions::default()).min_gpu_share;
        assert_eq!(floor, Some(crate::SHARED_MACHINE_MIN_GPU_SHARE));
        let set = DecodeOptions::default().min_gpu_share(Some(0.5));
        assert_eq!(four.decode_options(set).min_gpu_share, Some(0.5));
        let slurm = launch(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "2"),
        ])
        .expect("ok");
        assert_eq!(slurm.local_world, Some(2));
        let two = slurm.decode_options(DecodeOptions::default()).min_gpu_share;
        assert_eq!(two, None, "two ranks on the machine keep the rates' share");
        let alone = launch(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
        ])
        .expect("ok");
        assert_eq!(
            alone.decode_options(DecodeOptions::default()).min_gpu_share,
            None
        );
        let unknown = launch(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]);
        let unknown = unknown
            .expect("ok")
            .decode_options(DecodeOptions::default());
        assert_eq!(unknown.min_gpu_share, None);
    }

    #[test]
    fn missing_or_inconsistent_variables_are_errors_that_name_them() {
        assert!(reason(launch(&[])).contains("WORLD_SIZE"));
        assert!(reason(launch(&[("RANK", "0"), ("LOCAL_RANK", "0")])).contains("WORLD_SIZE"));
        assert!(reason(launch(&[("RANK", "1"), ("WORLD_SIZE", "2")])).contains("LOCAL_RANK"));
        assert!(reason(launch(&[
            ("RANK", "two"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0")
        ]))
        .contains("RANK=\"two\""));
        assert!(reason(launch(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0")
        ]))
        .contains("below"));
        assert!(reason(launch(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "0"),
            ("SLURM_LOCALID", "0")
        ]))
        .contains("SLURM_NTASKS=0"));
        assert!(reason(launch(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "3")
        ]))
        .contains("LOCAL_RANK"));
        let mut four = vec![("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "3")];
        four.push(("LOCAL_WORLD_SIZE", "four"));
        assert!(reason(launch(&four)).contains("LOCAL_WORLD_SIZE=\"four\""));
        four[3] = ("LOCAL_WORLD_SIZE", "2");
        assert!(reason(launch(&four)).contains("LOCAL_WORLD_SIZE=2"));
    }
}
