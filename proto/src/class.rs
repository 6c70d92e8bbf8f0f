//! Priority classes and sets of them.
//!
//! Every packet carries one of eight classes, 0 (lowest) to 7
//! ([`Class::CONTROL`], the class of PROBE, BITMAP, DONE and HELLO). What a
//! class means for a data chunk, and which classes a config makes droppable,
//! is the business of [`crate::priority`]; the wire format and the transfers
//! only carry and compare classes, so the type lives here, below both.

/// A priority class, 0 (lowest) to 7 (control).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Class(pub(crate) u8);

impl Class {
    /// Number of classes.
    pub const COUNT: usize = 8;
    /// The class of control packets.
    pub const CONTROL: Class = Class(7);
    /// The highest class a data chunk can have.
    pub const MAX_DATA: Class = Class(6);

    /// A class from its number, if in range.
    pub const fn new(v: u8) -> Option<Class> {
        if (v as usize) < Self::COUNT { Some(Class(v)) } else { None }
    }

    /// The class number.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The class number as an index into per-class tables.
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// All classes, lowest first.
    pub fn all() -> impl DoubleEndedIterator<Item = Class> {
        (0..Self::COUNT as u8).map(Class)
    }
}

/// A set of classes (bit `c` set = class `c` in the set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ClassSet(pub u8);

impl ClassSet {
    /// The empty set.
    pub const EMPTY: ClassSet = ClassSet(0);

    /// A set from a list of classes.
    pub fn from_classes(classes: impl IntoIterator<Item = Class>) -> ClassSet {
        ClassSet(classes.into_iter().fold(0, |m, c| m | (1 << c.get())))
    }

    /// True if `c` is in the set.
    pub fn contains(self, c: Class) -> bool {
        self.0 & (1 << c.get()) != 0
    }
}
