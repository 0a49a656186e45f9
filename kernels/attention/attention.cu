// placeholder
#include "kernels/attention/attention_internal.h"
