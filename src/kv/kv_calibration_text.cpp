#include "kv/kv_calibration_text.h"

namespace serval {

// Written for Serval.
const char* const kKvCalibrationText =
    "Once upon a time, in a small town at the edge of a wide green forest, there lived a girl named Lily. "
    "Every morning she walked to the river with her little brother Tom to watch the boats go by. One day they "
    "found a red ball stuck between two rocks. \"Can we keep it?\" Tom asked. Lily smiled and said, \"First we "
    "should look for the child who lost it.\" They asked the baker, the old man with the dog, and the woman who "
    "sold apples, and at last they met a boy who was crying near the bridge. When he saw the ball, he laughed "
    "and hugged them both. From that day on, the three of them played together after school.\n\n"
    "The river that runs through the town is about 42 kilometres long. It starts in the hills to the north, "
    "where snow melts in spring, and it reaches the sea after passing three villages, two mills and a railway "
    "bridge built in 1887. In a dry summer the water level can fall by more than a metre, and the farmers who "
    "depend on it must share what is left. The town council meets on the first Monday of each month to decide "
    "how much water each farm may take, and the results are posted on the door of the library.\n\n"
    "Scientists study rivers like this one to understand how water, soil and living things depend on each "
    "other. They measure the temperature, the speed of the current and the amount of oxygen in the water. "
    "They count the fish, the insects and the plants along the banks. When a factory or a new road changes "
    "the land, these numbers often change too, and careful records help people see what happened and why.\n\n"
    "In the evening, when the sun went down behind the hills, Lily liked to sit by the window and write in "
    "her notebook. She wrote about the boats, the birds and the people she had met, and sometimes she drew "
    "small pictures beside the words. Her grandmother told her that a good story needs a beginning, a middle "
    "and an end, but also a reason for the reader to care. Lily thought about that for a long time. Then she "
    "began a new page and wrote: \"Tomorrow we will follow the river all the way to the sea.\"\n";

}  // namespace serval
