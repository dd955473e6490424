package nldump

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestRetry(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name        string
		interrupted int // dumps answered ErrDumpInterrupted before a clean one
		final       error
		wantCalls   int
		wantErr     error
		wantOut     []int
	}{
		{"clean at once", 0, nil, 1, nil, []int{1}},
		{"interrupted twice", 2, nil, 3, nil, []int{3}},
		{"other error is final", 0, boom, 1, boom, []int{1}},
		{"always interrupted", 99, nil, Tries, netlink.ErrDumpInterrupted, []int{Tries}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			out, err := Retry(func() ([]int, error) {
				calls++
				if calls <= tc.interrupted {
					return []int{calls}, fmt.Errorf("listing: %w", netlink.ErrDumpInterrupted)
				}
				return []int{calls}, tc.final
			})
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) || len(out) != 1 || out[0] != tc.wantOut[0] {
				t.Fatalf("calls %d, out %v, err %v; want %d calls, out %v, err %v", calls, out, err, tc.wantCalls, tc.wantOut, tc.wantErr)
			}
		})
	}
}
