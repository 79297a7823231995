//! The acquire family, written once: every handle that takes a hold — `Mutex` and
//! `FairMutex`, an `RwLock`'s two sides, a `Semaphore`'s one permit and many, `MultiLock`,
//! `Shared<T>`, `RedlockMutex` — offers the same four calls (block, one attempt, wait up to a
//! timeout, wait until a deadline) over one private method of its own that takes an optional
//! deadline. [`acquire_family!`] writes the four; a kind names them (`lock`, `read`,
//! `acquire`…) and documents only its blocking call.

use crate::error::{Error, ErrorKind, Result};

/// The outcome of a blocking call (`call`, its name) whose acquire had no deadline: an
/// acquire without one ends with the hold or an error, never with `None`; if it ever did,
/// the caller gets a `Timeout` that names the call rather than a panic.
#[inline]
pub(crate) fn without_deadline<G>(call: &str, outcome: Result<Option<G>>) -> Result<G> {
    outcome?.ok_or_else(|| {
        Error::new(
            ErrorKind::Timeout,
            format!("{call}() gave up without a deadline"),
        )
    })
}

/// Writes the four calls of an acquire family as public methods of the handle it is used in:
///
/// ```text
/// acquire_family! {
///     take_until(extra args) -> Guard, "what is taken, for the docs";
///     /// the blocking call's own docs (summary, errors, examples)
///     fn lock, try_lock, try_lock_for, try_lock_until;
///     /// notes of the kind's for the three calls that may give up (optional)
/// }
/// ```
///
/// `take_until(extra args, deadline: Option<Instant>)` is the handle's own method: `None`
/// waits without a deadline; a deadline now or past makes exactly one attempt.
macro_rules! acquire_family {
    (
        $take:ident($($arg:ident: $argty:ty),*) -> $guard:ty, $what:literal;
        $(#[$lock_doc:meta])*
        fn $lock:ident, $try_:ident, $for_:ident, $until:ident;
        $(#[$note:meta])*
    ) => {
        $(#[$lock_doc])*
        pub fn $lock(&self, $($arg: $argty),*) -> $crate::Result<$guard> {
            let outcome = self.$take($($arg,)* None);
            $crate::primitives::acquire_family::without_deadline(stringify!($lock), outcome)
        }

        #[doc = concat!("One attempt at ", $what, ": `None` when it is not free now.")]
        $(#[$note])*
        ///
        /// # Errors
        ///
        #[doc = concat!("As for [`", stringify!($lock), "`](Self::", stringify!($lock), ").")]
        pub fn $try_(&self, $($arg: $argty),*) -> $crate::Result<Option<$guard>> {
            self.$take($($arg,)* Some(std::time::Instant::now()))
        }

        #[doc = concat!("Waits up to `timeout` for ", $what, "; `Ok(None)` when not had in")]
        /// time. At least one attempt is made, even with a zero timeout; a timeout too large
        /// for the clock waits without a deadline.
        $(#[$note])*
        ///
        /// # Errors
        ///
        #[doc = concat!("As for [`", stringify!($lock), "`](Self::", stringify!($lock), ").")]
        pub fn $for_(&self, $($arg: $argty,)* timeout: std::time::Duration)
            -> $crate::Result<Option<$guard>> {
            self.$take($($arg,)* std::time::Instant::now().checked_add(timeout))
        }

        #[doc = concat!("Waits until `deadline` for ", $what, "; `Ok(None)` when not had by")]
        /// then. A deadline in the past makes exactly one attempt.
        $(#[$note])*
        ///
        /// # Errors
        ///
        #[doc = concat!("As for [`", stringify!($lock), "`](Self::", stringify!($lock), ").")]
        pub fn $until(&self, $($arg: $argty,)* deadline: std::time::Instant)
            -> $crate::Result<Option<$guard>> {
            self.$take($($arg,)* Some(deadline))
        }
    };
}

pub(crate) use acquire_family;
