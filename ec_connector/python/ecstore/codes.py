"""The ECS_E* codes of include/ecstore/error.h, as module constants.

Codes are stable (they travel on the wire and are only ever appended), so
they are written out here rather than read from the library at import; the
test suite checks every one against ``ecs_err_name``.
"""

OK = 0
EINVAL = -1
ENOMEM = -2
ENOSPC = -3
ETOOBIG = -4
ENOTFOUND = -5
ECONFLICT = -6
ETIMEDOUT = -7
ECONN = -8
EPROTO = -9
ECHECKSUM = -10
EBUFSMALL = -11
EDOUBLEFREE = -12
EBADFREE = -13
EBADSIZE = -14
EREDIS = -15
EAUTH = -16
EIO = -17
EBUSY = -18
ESTALE = -19
ENOTSUP = -20
ENODEV = -21
ECORRUPT = -22
ECANCELED = -23
EKEY = -24
EDTYPE = -25
ENOTCONN = -26
EOVERFLOW = -27
ECODEC = -28
EPERM = -29
EQUOTA = -30
EPINQUOTA = -31

ALL = {name: value for name, value in globals().items() if name.isupper() and name != "OK"}
