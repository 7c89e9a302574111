//! Python binding of the accounting board (`Board`, `Ticket`, `Slot`, `acquire_slot`): converts arguments, results and errors only.

use std::path::PathBuf;

use narwhal_core::counters::{
    Board, BoardError, Class, NameError, Phase, Slot, Snapshot, Terminal, Ticket,
};
use narwhal_core::histogram::Histogram;
use narwhal_core::shm::ShmError;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

fn py_err(error: BoardError) -> PyErr {
    match error {
        // OSError(errno, message, filename): Python picks the subclass (FileNotFoundError...).
        BoardError::Shm(ShmError::Io { path, source }) => {
            let errno = source.raw_os_error().unwrap_or(0);
            PyOSError::new_err((errno, source.to_string(), path))
        }
        _ => PyValueError::new_err(error.to_string()),
    }
}

fn phase(name: &str) -> PyResult<Phase> {
    Phase::parse(name).ok_or_else(|| py_err(NameError::UnknownPhase(name.into()).into()))
}

/// The accounting board: private to this process, or a shared file (create or attach).
#[pyclass(module = "narwhal._narwhal_fast", name = "Board", frozen)]
pub struct PyBoard {
    board: Board,
}

#[pymethods]
impl PyBoard {
    #[new]
    #[pyo3(signature = (engines = 256, path = None, create = true))]
    fn new(engines: usize, path: Option<PathBuf>, create: bool) -> PyResult<Self> {
        let board = match path {
            None => Board::private(engines),
            Some(path) if create => Board::create(&path, engines),
            Some(path) => Board::attach(&path, engines),
        };
        Ok(PyBoard {
            board: board.map_err(py_err)?,
        })
    }

    fn arrive(&self, retention_limit: u64) -> (PyTicket, bool) {
        let (ticket, admitted) = self.board.arrive(retention_limit);
        (PyTicket { ticket }, admitted)
    }

    #[pyo3(signature = (engine, phase, limit, total_limit = None))]
    fn acquire_slot(
        &self,
        engine: usize,
        phase: &str,
        limit: u64,
        total_limit: Option<u64>,
    ) -> PyResult<Option<PySlot>> {
        let phase = self::phase(phase)?;
        let slot = self
            .board
            .acquire_slot_within(engine, phase, limit, total_limit.unwrap_or(u64::MAX))
            .map_err(py_err)?;
        Ok(slot.map(|slot| PySlot { slot }))
    }

    fn queued(&self) -> u64 {
        self.board.queued()
    }

    fn inflight(&self, engine: usize) -> PyResult<(u64, u64)> {
        self.board.inflight(engine).map_err(py_err)
    }

    fn set_engine_up(&self, engine: usize, up: bool) -> PyResult<()> {
        self.board.set_engine_up(engine, up).map_err(py_err)
    }

    fn observe(&self, histogram: &str, value: f64) -> PyResult<()> {
        let which = Histogram::parse(histogram)
            .ok_or_else(|| py_err(NameError::UnknownHistogram(histogram.into()).into()))?;
        self.board.observe(which, value).map_err(py_err)
    }

    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        snapshot_dict(py, &self.board.snapshot())
    }

    fn reap_dead(&self) -> u64 {
        self.board.reap_dead()
    }

    fn unlink(&self) -> PyResult<()> {
        self.board.unlink().map_err(py_err)
    }

    #[getter]
    fn engines(&self) -> usize {
        self.board.engines()
    }

    #[getter]
    fn path(&self) -> Option<String> {
        self.board.path().map(|p| p.to_string_lossy().into_owned())
    }
}

/// Free-function form of `Board.acquire_slot`.
#[pyfunction]
fn acquire_slot(
    board: &PyBoard,
    engine: usize,
    phase: &str,
    limit: u64,
) -> PyResult<Option<PySlot>> {
    board.acquire_slot(engine, phase, limit, None)
}

/// One retained request; finishing is exactly-once, dropping finishes it as cancelled.
#[pyclass(module = "narwhal._narwhal_fast", name = "Ticket")]
pub struct PyTicket {
    ticket: Ticket,
}

#[pymethods]
impl PyTicket {
    fn sized(&mut self, prompt_tokens: u64) {
        self.ticket.sized(prompt_tokens)
    }

    fn enqueue(&mut self, queue_limit: u64) -> bool {
        self.ticket.enqueue(queue_limit)
    }

    fn dequeue(&mut self) {
        self.ticket.dequeue()
    }

    #[pyo3(signature = (cls, reason = None))]
    fn finish(&mut self, cls: &str, reason: Option<&str>) -> PyResult<bool> {
        let terminal = Terminal::parse(cls, reason).map_err(|e| py_err(e.into()))?;
        Ok(self.ticket.finish(terminal))
    }

    #[getter]
    fn finished(&self) -> bool {
        self.ticket.is_finished()
    }

    #[getter]
    fn admitted(&self) -> bool {
        self.ticket.holds_retention()
    }

    #[getter]
    fn queued(&self) -> bool {
        self.ticket.is_queued()
    }
}

/// One phase slot on one engine; `release()` is idempotent, dropping releases.
#[pyclass(module = "narwhal._narwhal_fast", name = "Slot")]
pub struct PySlot {
    slot: Slot,
}

#[pymethods]
impl PySlot {
    fn release(&mut self) -> bool {
        self.slot.release()
    }

    #[getter]
    fn released(&self) -> bool {
        self.slot.is_released()
    }

    #[getter]
    fn engine(&self) -> usize {
        self.slot.engine()
    }

    #[getter]
    fn phase(&self) -> &'static str {
        self.slot.phase().as_str()
    }
}

fn snapshot_dict<'py>(py: Python<'py>, s: &Snapshot) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("offered", s.offered)?;
    out.set_item("unsized_offered", s.unsized_offered)?;
    out.set_item("offered_prompt_tokens", s.offered_prompt_tokens)?;
    out.set_item("retained", s.retained)?;
    out.set_item("retention_held", s.retention_held)?;
    out.set_item("queued", s.queued)?;
    out.set_item("cancelled", s.cancelled)?;
    out.set_item("completed", s.completed)?;
    for &class in Class::ALL {
        let reasons = PyDict::new(py);
        for (reason, count) in s.reasons(class) {
            reasons.set_item(reason.as_str(), count)?;
        }
        out.set_item(class.as_str(), reasons)?;
    }
    let engines = PyList::empty(py);
    for e in &s.engines {
        let cell = PyDict::new(py);
        cell.set_item("prefill", e.prefill)?;
        cell.set_item("decode", e.decode)?;
        cell.set_item("up", e.up)?;
        engines.append(cell)?;
    }
    out.set_item("engines", engines)?;
    let histograms = PyDict::new(py);
    for h in &s.histograms {
        let bounds = h.histogram.bounds().iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(h.cumulative.iter().copied()).collect();
        let entry = PyDict::new(py);
        entry.set_item("buckets", buckets)?;
        entry.set_item("sum", h.sum)?;
        entry.set_item("count", h.count)?;
        histograms.set_item(h.histogram.as_str(), entry)?;
    }
    out.set_item("histograms", histograms)?;
    out.set_item("reaped", s.reaped)?;
    out.set_item("workers", s.workers)?;
    out.set_item("lock_steals", s.lock_steals)?;
    Ok(out)
}

/// Adds the board's classes and function to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBoard>()?;
    m.add_class::<PyTicket>()?;
    m.add_class::<PySlot>()?;
    m.add_function(wrap_pyfunction!(acquire_slot, m)?)?;
    Ok(())
}
