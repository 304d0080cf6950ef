package ferry

import "fmt"

// Status is a ferry_status code of the C ABI.
type Status int32

// The codes ferry's C ABI returns (ferry_status in ferry.h).
const (
	statusOK              Status = 0
	StatusInvalidArgument Status = 1
	StatusFormatError     Status = 2
	StatusIOError         Status = 3
	StatusNotFound        Status = 4
	StatusCUDAError       Status = 5
	StatusOutOfMemory     Status = 6
	StatusInternalError   Status = 7
)

// Error is a failed ferry call: the Status code and ferry's message, which names the file and
// the problem.
type Error struct {
	Op      string
	Status  Status
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("ferry: %s: %s", e.Op, e.Message)
}
