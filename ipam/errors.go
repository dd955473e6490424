package ipam

import (
	"errors"
	"fmt"
)

// Errors callers test with errors.Is. The error values returned carry a full
// sentence meant for the user (what failed, why, what to do); these sentinels
// only classify them, so the driver can map them to Docker replies.
var (
	// ErrExhausted: no address could be found for the request. Also wrapped
	// by ErrMaxBlocks failures, so `errors.Is(err, ErrExhausted)` catches every
	// "out of addresses" case.
	ErrExhausted = errors.New("no free IP address")
	// ErrPoolDisabled: the only pools that could serve the request are disabled.
	ErrPoolDisabled = errors.New("IP pool is disabled")
	// ErrPoolNotFound: no pool with that CIDR, or none containing the subnet.
	ErrPoolNotFound = errors.New("IP pool not found")
	// ErrNotInPool: the address lies outside every configured pool.
	ErrNotInPool = errors.New("address is not in any IP pool")
	// ErrAddressInUse: a specific address is already assigned to another handle.
	ErrAddressInUse = errors.New("address already in use")
	// ErrPoolOverlap: a new pool overlaps (or equals) an existing one.
	ErrPoolOverlap = errors.New("IP pool overlaps an existing pool")
	// ErrPoolExists is wrapped together with ErrPoolOverlap when the new pool
	// is identical to an existing one.
	ErrPoolExists = errors.New("IP pool already exists")
	// ErrInvalidCIDR: malformed or unusable CIDR / block size.
	ErrInvalidCIDR = errors.New("invalid CIDR")
	// ErrPoolInUse: a pool still has allocated addresses and cannot be deleted.
	ErrPoolInUse = errors.New("IP pool has allocated addresses")
	// ErrMaxBlocks: the host owns maxBlocksPerHost blocks, all full.
	ErrMaxBlocks = errors.New("host reached maxBlocksPerHost")
	// ErrStrictAffinity: a specific address lies in a block affine to another
	// host (or to none) and strictAffinity forbids using it.
	ErrStrictAffinity = errors.New("address is in another host's block and strictAffinity is set")
	// ErrInvalidArgument: a request is missing a host, a handle, an IP...
	ErrInvalidArgument = errors.New("invalid IPAM request")
)

// userError is an error whose text is a complete, user-facing sentence while
// errors.Is still sees the classifying sentinels.
type userError struct {
	msg   string
	kinds []error
}

func (e *userError) Error() string   { return e.msg }
func (e *userError) Unwrap() []error { return e.kinds }

// NewUserError is msg as one line for the user that still unwraps to every
// cause, sentinel or underlying error (errors.Join would add lines); nil
// causes are skipped. The driver words its errors with it too.
func NewUserError(msg string, causes ...error) error {
	e := &userError{msg: msg}
	for _, c := range causes {
		if c != nil {
			e.kinds = append(e.kinds, c)
		}
	}
	return e
}

func newError(kind error, format string, args ...any) error {
	return NewUserError(fmt.Sprintf(format, args...), kind)
}

func newError2(kind1, kind2 error, format string, args ...any) error {
	return NewUserError(fmt.Sprintf(format, args...), kind1, kind2)
}
