#pragma once

#include "high/sub/deep.h"
#include "low/low.h"
