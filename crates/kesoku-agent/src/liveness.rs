//! Who holds a claim, and whether that holder is still alive.
//!
//! A claim records `host/pid/instance`. On the same host, a claim whose process is gone (or
//! whose pid now belongs to a different instance, such as this restarted one) is dead at once;
//! claims from other hosts are only judged by age, through the heartbeat-renewed claim time.

use std::sync::OnceLock;

/// This process's identity, stable for its lifetime.
pub fn worker_id() -> String {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "localhost".to_owned());
        let instance = kesoku_core::ActivationId::generate().into_string();
        let instance = instance.trim_start_matches("act_").to_owned();
        format!("{host}/{}/{instance}", std::process::id())
    })
    .clone()
}

/// Whether the claimant `claimed_by` is certainly gone, judged from this process (`me`).
pub fn claim_is_dead(claimed_by: &str, me: &str) -> bool {
    let mut theirs = claimed_by.splitn(3, '/');
    let mut mine = me.splitn(3, '/');
    let (Some(their_host), Some(their_pid), Some(their_instance)) = (theirs.next(), theirs.next(), theirs.next())
    else {
        return false;
    };
    let (Some(my_host), Some(my_pid), Some(my_instance)) = (mine.next(), mine.next(), mine.next()) else {
        return false;
    };
    if their_host != my_host {
        return false;
    }
    if their_pid == my_pid {
        return their_instance != my_instance;
    }
    let Ok(pid) = their_pid.parse::<i32>() else { return false };
    // Signal 0 checks existence only. ESRCH: no such process.
    matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_claims_on_this_host() {
        let me = worker_id();
        assert!(!claim_is_dead(&me, &me), "my own live claim");
        let host = me.split('/').next().unwrap_or_default();
        let pid = std::process::id();
        assert!(claim_is_dead(&format!("{host}/{pid}/someoneelse"), &me), "an earlier instance with my pid");
        // pid 0x7ffffff0 does not exist on any normal system.
        assert!(claim_is_dead(&format!("{host}/2147483632/x"), &me), "a gone process");
        assert!(!claim_is_dead("otherhost/1/x", &me), "other hosts are judged by age only");
        assert!(!claim_is_dead("garbage", &me));
    }
}
