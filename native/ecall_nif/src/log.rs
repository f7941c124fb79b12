//! Rust `tracing` events to the Erlang `logger`.
//!
//! A minimal subscriber, installed once when the NIF loads, formats each
//! event (its message and fields) and sends `{ecall_log, Level, Target,
//! Text}` to the process registered through `log_target/2` (`ecall_log`),
//! which hands it to `logger` with the same level. Spans are not tracked:
//! nothing in the C-node uses them. Events below the level given with the
//! target, and all events while no target is set, cost one atomic load.

use crate::atoms;
use crate::runtime::runtime;
use rustler::env::OwnedEnv;
use rustler::{Atom, Encoder, LocalPid};
use std::fmt::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::RwLock;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// 0: off; 1 error, 2 warn, 3 info, 4 debug, 5 trace.
static MAX: AtomicU8 = AtomicU8::new(0);
static TARGET: RwLock<Option<LocalPid>> = RwLock::new(None);

fn rank(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

/// Sets (or clears, with `max == 0`) where events go and the most verbose
/// level forwarded.
fn set_target(pid: Option<LocalPid>, max: u8) {
    *TARGET.write().unwrap_or_else(|p| p.into_inner()) = pid;
    MAX.store(if pid.is_some() { max } else { 0 }, Ordering::Release);
}

/// Sends Rust `tracing` events up to `max` (1 error .. 5 trace; 0 stops)
/// to `pid` as `{ecall_log, Level, Target, Text}`.
#[rustler::nif]
fn log_target(pid: LocalPid, max: u8) -> Atom {
    set_target(Some(pid), max);
    atoms::ok()
}

/// Stops forwarding `tracing` events.
#[rustler::nif]
fn log_off() -> Atom {
    set_target(None, 0);
    atoms::ok()
}

/// Installs the subscriber (once per OS process; later calls do nothing).
pub fn install() {
    let _ = tracing::subscriber::set_global_default(Forward);
}

struct Forward;

#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={:?}", field.name(), value);
        }
    }
}

impl Subscriber for Forward {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        rank(metadata.level()) <= MAX.load(Ordering::Acquire)
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let Some(pid) = *TARGET.read().unwrap_or_else(|p| p.into_inner()) else {
            return;
        };
        let mut text = Text::default();
        event.record(&mut text);
        let line = format!("{}{}", text.message, text.fields);
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG | Level::TRACE => "debug",
        };
        let target = event.metadata().target().to_string();
        let send = move || {
            let mut env = OwnedEnv::new();
            let _ = env.send_and_clear(&pid, |env| {
                let level = Atom::from_str(env, level).map(|a| a.encode(env));
                (
                    atoms::ecall_log(),
                    level.unwrap_or_else(|_| "info".encode(env)),
                    target,
                    line,
                )
                    .encode(env)
            });
        };
        // An OwnedEnv cannot send from a scheduler thread.
        if rustler::thread::is_scheduler_thread() {
            runtime().spawn(async move { send() });
        } else {
            send();
        }
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
