//! What the kernel says about a process and the machine: resident memory from
//! `/proc/PID/status`, CPU time from `getrusage`, the CPU's model from `/proc/cpuinfo`. Linux
//! only, read-only.

use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};

/// Resident and peak resident set of a process, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss: u64,
    /// `VmHWM`: the most it was resident.
    pub peak: u64,
    /// `RssAnon`: the resident part that is the process's own memory (heap, stacks), not
    /// pages of its binary or of files it maps.
    pub anon: u64,
}

/// The memory of process `pid` (`None`: it is gone or the file is unreadable).
pub fn memory_of(pid: u32) -> Option<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(Memory {
        rss: status_kib(&status, "VmRSS:")? * 1024,
        peak: status_kib(&status, "VmHWM:")? * 1024,
        anon: status_kib(&status, "RssAnon:")? * 1024,
    })
}

/// The memory of this process.
pub fn own_memory() -> Option<Memory> {
    memory_of(std::process::id())
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// User plus system CPU time this process used so far (all threads).
pub fn own_cpu_time() -> Duration {
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|usage| timeval(usage.user_time()) + timeval(usage.system_time()))
        .unwrap_or_default()
}

/// User plus system CPU time of the children this process has waited for, summed.
pub fn children_cpu_time() -> Duration {
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|usage| timeval(usage.user_time()) + timeval(usage.system_time()))
        .unwrap_or_default()
}

/// The whole machine's CPU time so far from `/proc/stat` (every process: PostgreSQL and Redis
/// too), as (busy, total) jiffies over all CPUs; `None` where it cannot be read.
pub fn machine_cpu() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal …: idle and iowait are not busy.
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// The largest peak resident set of any child this process has waited for, in bytes.
pub fn children_peak_rss() -> Option<u64> {
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    u64::try_from(usage.max_rss()).ok().map(|kib| kib * 1024)
}

/// The machine a table was measured on, for its header: the CPU's model name (as `lscpu`
/// prints it) and how many CPUs this process may use. Figures of one machine say little about
/// another (the local engine against llama.cpp reverses between an AMD EPYC and an Intel Xeon VM).
pub fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|cpuinfo| cpu_model(&cpuinfo));
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    format!("{}, {cpus} CPUs", model.as_deref().unwrap_or("unknown CPU"))
}

/// The first `model name` of a `/proc/cpuinfo` text, its runs of spaces collapsed.
fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "model name").then(|| value.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .filter(|model| !model.is_empty())
}

fn timeval(value: nix::sys::time::TimeVal) -> Duration {
    let seconds = u64::try_from(value.tv_sec()).unwrap_or(0);
    let micros = u64::try_from(value.tv_usec()).unwrap_or(0);
    Duration::from_secs(seconds) + Duration::from_micros(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu() {
        let memory = own_memory().expect("/proc/self/status");
        assert!(memory.rss > 0 && memory.peak >= memory.rss, "{memory:?}");
        assert!(memory.anon > 0 && memory.anon <= memory.rss, "{memory:?}");
        let spin: u64 = (0..2_000_000u64).map(|x| x ^ (x >> 3)).sum();
        assert!(spin > 0);
        assert!(own_cpu_time() > Duration::ZERO);
    }

    #[test]
    fn the_cpu_model_is_the_first_model_name() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 143\n\
                       model name\t: Intel(R) Xeon(R)  Platinum 8481C CPU @ 2.70GHz\n\n\
                       processor\t: 1\nmodel name\t: other\n";
        assert_eq!(cpu_model(cpuinfo).as_deref(), Some("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"));
        assert_eq!(cpu_model("processor\t: 0\nmodel name\t:\n"), None);
        assert_eq!(cpu_model(""), None);
    }
}
