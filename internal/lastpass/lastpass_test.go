package lastpass

import (
	"errors"
	"testing"
)

func TestOutcome(t *testing.T) {
	o := New("VXLAN")
	if err := o.Err(); err != nil {
		t.Fatalf("before any pass: %v", err)
	}
	cause := errors.New("netlink: operation not permitted")
	o.Record(cause)
	err := o.Err()
	if !errors.Is(err, cause) || err.Error() != "VXLAN cannot be programmed: netlink: operation not permitted" {
		t.Fatalf("after a failed pass: %v", err)
	}
	o.Record(nil)
	if err := o.Err(); err != nil {
		t.Fatalf("after a good pass: %v", err)
	}
}
