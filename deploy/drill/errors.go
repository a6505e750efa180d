package drill

import "fmt"

// ConfigError is a drill that cannot run as configured (an unknown
// scenario, a region with no router or no shard): Run returns it before it
// touches the bed.
type ConfigError struct{ msg string }

func (e *ConfigError) Error() string { return e.msg }

func configError(format string, args ...any) error {
	return &ConfigError{msg: fmt.Sprintf(format, args...)}
}
