//! A bounded first-in, first-out buffer: the dashboard keeps the last 15 minutes of points and
//! the latest events in fixed memory, whatever the uptime.

use std::collections::VecDeque;

/// Holds at most `capacity` items; pushing beyond drops the oldest.
#[derive(Clone, Debug)]
pub struct Ring<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> Ring<T> {
    /// An empty ring of `capacity` items (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Ring {
            items: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Appends `item`, dropping the oldest when full.
    pub fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    /// How many items it holds.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The newest item.
    pub fn last(&self) -> Option<&T> {
        self.items.back()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_items_in_order() {
        // (capacity, pushed 0..n, expected contents)
        let cases: &[(usize, u32, &[u32])] = &[
            (3, 0, &[]),
            (3, 2, &[0, 1]),
            (3, 3, &[0, 1, 2]),
            (3, 7, &[4, 5, 6]),
            (1, 5, &[4]),
            (0, 2, &[1]),
        ];
        for (capacity, n, want) in cases {
            let mut r = Ring::new(*capacity);
            for i in 0..*n {
                r.push(i);
            }
            let got: Vec<u32> = r.iter().copied().collect();
            assert_eq!(got, want.to_vec(), "capacity {capacity}, {n} pushed");
            assert_eq!(r.len(), want.len());
            assert_eq!(r.is_empty(), want.is_empty());
            assert_eq!(r.last().copied(), want.last().copied());
        }
    }

    #[test]
    fn fifteen_minutes_at_one_point_a_second_stay_bounded() {
        let mut r = Ring::new(900);
        for i in 0..10_000u32 {
            r.push(i);
        }
        assert_eq!(r.len(), 900);
        assert_eq!(r.iter().next().copied(), Some(10_000 - 900));
    }
}
