// Package lastpass keeps the outcome of a sync loop's last pass, so that
// /healthz can go red while a loop cannot program what it owns, and green
// again at its first good pass.
package lastpass

import (
	"fmt"
	"sync"
)

// Outcome is the last pass's error (nil: it worked, or none ran yet).
type Outcome struct {
	what string
	mu   sync.Mutex
	err  error
}

// New names what the loop programs ("VXLAN", "published ports"): the
// health error starts with it.
func New(what string) *Outcome { return &Outcome{what: what} }

// Record keeps err as the last pass's outcome.
func (o *Outcome) Record(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.err = err
}

// Err is the last pass's error, saying what could not be programmed.
func (o *Outcome) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err == nil {
		return nil
	}
	return fmt.Errorf("%s cannot be programmed: %w", o.what, o.err)
}
